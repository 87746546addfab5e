#!/bin/sh
# cr-run.sh CMD [ARGS...]: a Criterion test binary built with ASan, under a watchdog.
#
# Criterion's runner has a second thread (nanomsg's poller) and forks a worker per test. GCC
# 12's libsanitizer installs no fork handler (LLVM added one in 2023, llvm-project #75290), so
# a worker forked while that thread holds ASan's allocator lock waits on the lock forever, in
# its first malloc, before any test code runs: seen once here, with the machine loaded, in
# test_backend under CUDA_EMU_STREAMS=late-first (the worker asleep in
# __sanitizer::FutexWait, the runner in waitpid). A test that ends its run in a deadlock of
# the runtime says nothing about our code, so a run past CR_TIMEOUT seconds (default 1200;
# the slowest binary takes a few minutes) is killed, process group and all, and run once
# more from the start, saying so. A second time out fails, as does any other failure: no
# test's verdict is retried.
limit=${CR_TIMEOUT:-1200}
timeout -k 10 "$limit" "$@"
rc=$?
[ "$rc" = 124 ] || [ "$rc" = 137 ] || exit "$rc"
echo "cr-run.sh: '$*' ran past $limit s (a Criterion worker deadlocked in ASan's allocator after fork?): running it once more" >&2
exec timeout -k 10 "$limit" "$@"
