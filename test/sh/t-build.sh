# The build follows what it finds: a build made without Open MPI and then with it (what a new
# user gets from the quickstart, then the test command's setup) compiles lib/dist over MPI,
# makes libcore.a anew without dist_single.o, and relinks; a build with nothing changed does
# nothing; SentencePiece found or lost recompiles the tokenizer alone. In a build folder of
# its own (-O0, no CUDA: the Makefile is under test, not the compiler), in the plain pass only,
# with none of the calling make's flags (a make -j2 test or BUILD=... must not leak in).
set -eu
. "$TESTDIR/lib.sh"
[ "${SAN:-0}" = 1 ] && skip "skipped under the sanitizers: the Makefile is tested in the plain pass"
root=$(cd "$TESTDIR/../.." && pwd)
b=$SCRATCH/build
prog=$b/bin/dpc-train-path
# mk LOG ARGS...: the build of libcore.a and one program, its step lines in LOG
mk() {
	log=$1; shift
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$root" -j2 BUILD="$b" OPT=-O0 \
		HAVE_CUDA=0 "$@" "$b/libcore.a" "$prog" >"$log" 2>&1 ||
		{ tail -n 20 "$log"; die "make $* failed"; }
}
# steps LOG: the CC, AR and LINK lines of a build, one per line
steps() { grep -E '^  (CC|CXX|AR|LINK) ' "$1" | sed 's/^  *//' || true; }
members() { ar t "$b/libcore.a" | grep '^dist_' | tr '\n' ' '; }

mk without.log MPICC=/nonexistent/mpicc
m=$(members)
case $m in *dist_single.o*) ;; *) die "without MPI, libcore.a holds no dist_single.o: $m" ;; esac
grep -q 'this build has no MPI' "$prog" || die "without MPI, $prog does not say so"
echo "without MPI: libcore.a's dist members: $m"
cp "$b/found/mpi" found-mpi-without 2>/dev/null || :

mk again.log MPICC=/nonexistent/mpicc
[ -z "$(steps again.log)" ] || { steps again.log; die "nothing changed, yet the build did the above"; }
echo "nothing changed: no step"

command -v mpicc >/dev/null 2>&1 || skip "skipped the rest: no mpicc here (install libopenmpi-dev)"
mk with.log
m=$(members)
case $m in *dist_single.o*) die "with MPI, libcore.a still holds dist_single.o: $m" ;; esac
case $m in *dist_mpi.o*) ;; *) die "with MPI, libcore.a holds no dist_mpi.o: $m" ;; esac
nm "$prog" | grep -q ' MPI_Init' || die "with MPI, $prog does not call MPI_Init"
grep -q 'this build has no MPI' "$prog" && die "with MPI, $prog still has dist_single's message"
cc=$(steps with.log | grep -c '^CC' || true)
[ "$cc" = 1 ] && steps with.log | grep -q '^CC *lib/dist/dist_mpi.c' ||
	{ steps with.log; die "MPI found: expected dist_mpi.c alone compiled, got the above"; }
echo "MPI found: compiled dist_mpi.c alone; libcore.a's dist members: $m"

if grep -qx 'HAVE_SPM=1' "$b/found/spm" 2>/dev/null; then
	mk nospm.log HAVE_SENTENCEPIECE=0
	got=$(steps nospm.log | grep -E '^(CC|CXX)' | tr -s ' ' | tr '\n' ';')
	[ "$got" = "CC lib/io/tokenizer.c;" ] || die "SentencePiece lost: expected tokenizer.c alone compiled, got: $got"
	nm "$b/lib/io/tokenizer.o" | grep -q spm_ && die "SentencePiece lost: tokenizer.o still calls the shim"
	mk spm.log
	got=$(steps spm.log | grep -E '^(CC|CXX)' | tr -s ' ' | tr '\n' ';')
	[ "$got" = "CC lib/io/tokenizer.c;" ] || die "SentencePiece found again: expected tokenizer.c alone compiled, got: $got"
	nm "$b/lib/io/tokenizer.o" | grep -q spm_ || die "SentencePiece found: tokenizer.o does not call the shim"
	echo "SentencePiece lost, then found: tokenizer.c alone compiled each time"
fi
# what the build recorded
grep -qx 'HAVE_MPI=0' found-mpi-without 2>/dev/null || die "without MPI, found/mpi said: $(cat found-mpi-without 2>&1)"
grep -q '^HAVE_MPI=1 ' "$b/found/mpi" || die "with MPI, found/mpi says: $(cat "$b/found/mpi" 2>&1)"
echo "recorded in $b/found: $(ls "$b/found" | tr '\n' ' ')"
