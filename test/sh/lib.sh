# Helpers for the shell tests; sourced as ". "$TESTDIR/lib.sh"".
# Each check prints what it expected and what it got, and exits 1 on a mismatch.

die() { echo "FAILED: $*"; exit 1; }
skip() { echo "$*"; exit 77; }
# need_torch: skip (77) unless $PY (the caller's /usr/bin/python3) imports torch and numpy
need_torch() {
	[ -x "$PY" ] && "$PY" -c 'import torch, numpy' 2>/dev/null ||
		skip "skipped: $PY cannot import torch and numpy (reference tests need python3-torch)"
}

# expect_fail CODE PATTERN CMD...: CMD exits with CODE and writes exactly one stderr line
# that matches the extended regex PATTERN.
expect_fail() {
	code=$1 pat=$2; shift 2
	"$@" >out.stdout 2>out.stderr && rc=0 || rc=$?
	[ "$rc" = "$code" ] || { cat out.stderr; die "$* exited $rc, expected $code"; }
	n=$(wc -l <out.stderr)
	[ "$n" -eq 1 ] || { cat out.stderr; die "$*: expected one stderr line, got $n"; }
	grep -Eq -- "$pat" out.stderr || die "$*: stderr '$(cat out.stderr)' does not match '$pat'"
}

# expect_ok CMD...: CMD exits 0.
expect_ok() {
	"$@" >out.stdout 2>out.stderr || { cat out.stderr; die "$* failed"; }
}

# same_file A B: the files are byte-identical.
same_file() { cmp -s "$1" "$2" || die "'$1' and '$2' differ"; }

# kill_task DIR PATTERN: SIGKILL the processes whose command line matches PATTERN (pgrep -f)
# and whose working directory is DIR, so that a test never kills another run's tasks (a run's
# tasks all say "--run ."); fails when there is none.
kill_task() {
	want=$(cd "$1" && pwd -P) hit=1
	for p in $(pgrep -f -- "$2"); do
		[ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$want" ] || continue
		kill -KILL "$p" 2>/dev/null && hit=0
	done
	return $hit
}

# mpi_run N CMD...: CMD on N ranks under mpirun, oversubscribed, quiet (only the programs' own
# lines), ASAN_OPTIONS and OMP_NUM_THREADS passed on, killed after 240 s (a hang fails).
mpi_run() {
	n=$1; shift
	timeout -k 10 240 mpirun --quiet --oversubscribe -x ASAN_OPTIONS -x OMP_NUM_THREADS \
		-np "$n" "$@"
}
