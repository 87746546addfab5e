#!/bin/sh
# cr-run.sh CMD [ARGS...]: a Criterion test binary built with ASan, under a watchdog.
#
# Criterion's runner has a second thread (nanomsg's poller) and forks a worker per test. GCC
# 12's libsanitizer installs no fork handler (LLVM added one in 2023, llvm-project #75290), so
# a worker forked while that thread holds ASan's allocator lock waits on the lock forever, in
# its first malloc, before any test code runs: seen in the emulator's test_backend in two
# runs of make check out of two on a loaded machine (the worker asleep in
# __sanitizer::FutexWait in a malloc of 152 bytes, the runner in waitpid). A run that ends
# in a deadlock of the runtime says nothing about our code, so a run past CR_TIMEOUT seconds
# (default 600; the slowest, test_backend on the emulator, took under 3 minutes on a loaded
# 2-core machine) is killed, process
# group and all, and run again from the start, saying so, up to CR_TRIES runs in all
# (default 3). Every other exit status is final: no test's verdict is retried. The Makefile
# also turns off ASan's release of memory to the OS, which runs under that lock.
limit=${CR_TIMEOUT:-600} tries=${CR_TRIES:-3}
n=1
while :; do
	timeout -k 10 "$limit" "$@"
	rc=$?
	[ "$rc" = 124 ] || [ "$rc" = 137 ] || exit "$rc"
	[ "$n" -lt "$tries" ] || { echo "cr-run.sh: '$*' ran past $limit s $n times" >&2; exit "$rc"; }
	echo "cr-run.sh: '$*' ran past $limit s (a Criterion worker deadlocked in ASan's allocator after fork?): running it again ($((n + 1)) of $tries)" >&2
	n=$((n + 1))
done
