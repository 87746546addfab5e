# lib/dist under mpirun (test/mpi/test_dist.c): at 2, 4 and 8 ranks, in the host layout and
# in nodes of 1, 2 and 4 ranks, every All-to-All algorithm delivers the bytes of the fill
# formula and of MPI_Alltoall, and the collectives their hand-computed values; ranks that
# disagree (dist_agree) or of which one fails (dist_agree_rc) all fail with one line each,
# the same line for a disagreement, and none hangs; the benchmark's own check passes. Every
# mpirun is under a time limit.
set -eu
. "$TESTDIR/lib.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
t=${MPITEST:-}/test_dist
[ -n "${MPITEST:-}" ] && [ -x "$t" ] || skip "skipped: no MPI test programs (MPITEST; a build without MPI: apt-get install libopenmpi-dev)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI 4.1 leaves some 3,400 allocations (120 KB: hwloc, its dlopen'ed components) unfreed
# after MPI_Finalize, which LeakSanitizer reports at exit under ASan (make SAN=1), none of them
# from lib/dist: leak detection is off here, the other ASan and UBSan checks stay on (and
# ASAN_OPTIONS means nothing to other builds).
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
# run [+LIMIT] N ARGS...: test_dist ARGS on N ranks, oversubscribed, killed after LIMIT seconds
# (default 240)
run() {
	lim=240
	case $1 in +*) lim=${1#+}; shift ;; esac
	n=$1; shift
	timeout -k 10 "$lim" mpirun --oversubscribe -x ASAN_OPTIONS -np "$n" "$t" "$@"
}

for n in 2 4 8; do
	run "$n" >all.out 2>all.err || { cat all.out all.err; die "test_dist at $n ranks failed"; }
	grep -q "^test_dist: $n ranks: .* 0 failed over all ranks" all.out ||
		{ cat all.out all.err; die "test_dist at $n ranks: no summary line"; }
	cat all.out
done

# The benchmark, briefly, with real 2DH (nodes of 2): its own check against MPI_Alltoall
# passes and its table has a row per size, 1 KiB to 64 KiB.
run 4 bench 2 3 65536 >bench.out 2>bench.err || { cat bench.out bench.err; die "bench failed"; }
[ "$(grep -cE '^ +[0-9]+ +[0-9]+ ' bench.out)" -eq 4 ] || { cat bench.out; die "bench: not 4 rows"; }

# Rank 1 passes E = 4, the others 8: every rank says so in the same one line and exits 2.
for n in 2 4; do
	run +60 "$n" agree >agree.out 2>agree.err && rc=0 || rc=$?
	[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || die "agree at $n ranks: hung (killed after 60 s)"
	[ "$rc" -ne 0 ] || die "agree at $n ranks: mpirun exited 0"
	grep '^test_dist:' agree.err >lines || true
	[ "$(wc -l <lines)" -eq "$n" ] || { cat agree.err; die "agree at $n ranks: expected $n lines"; }
	[ "$(sort -u lines)" = "test_dist: ranks disagree on E: 4 on rank 1, 8 on rank 0" ] ||
		{ cat agree.err; die "agree at $n ranks: not the one expected line"; }
done

# Rank n-1 fails to read its file: every rank fails, none waits in the collective after.
n=4
run +60 "$n" agree-rc >rc.out 2>rc.err && rc=0 || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || die "agree-rc: hung (killed after 60 s)"
[ "$rc" -ne 0 ] || die "agree-rc: mpirun exited 0"
grep '^test_dist:' rc.err | sort >lines || true
printf '%s\n' "test_dist: 'data.bin': cannot read: no such file" \
	"test_dist: rank 3 failed: 'data.bin': cannot read: no such file" \
	"test_dist: rank 3 failed: 'data.bin': cannot read: no such file" \
	"test_dist: rank 3 failed: 'data.bin': cannot read: no such file" | sort >want
cmp -s lines want || { cat rc.err; die "agree-rc: not one line per rank as expected"; }
echo "dist: exchanges, collectives and agreement at 2, 4 and 8 ranks"
