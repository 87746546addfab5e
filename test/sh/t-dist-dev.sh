# The device All-to-All (lib/dist/dist_dev.c) under mpirun, on the cuda backend run by the CPU
# emulator with NCCL emulated over MPI (build/emu/test_dist_dev, test/mpi/test_dist_dev.c): at
# 1, 2, 4 and 8 ranks, in the host layout and in nodes of 1, 2 and 4 ranks, device Linear and
# device 2DH deliver the bytes of the host MPI_Alltoall on the same data, sentinels untouched;
# misused rounds of transfers fail on every rank instead of hanging; moe-bench runs the layer
# on the emulated device and refuses --a2a mpi there. Then the same program
# built against the real CUDA runtime and NCCL, on one rank: here (no GPU) it must say that it
# skipped; on a GPU it runs the one-rank checks (a world of one is a device copy).
set -eu
. "$TESTDIR/lib.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
t=${EMUTEST:-}/test_dist_dev
[ -n "${EMUTEST:-}" ] && [ -x "$t" ] ||
	skip "skipped: no emulated device test (EMUTEST; needs MPI and a C++ compiler: apt-get install libopenmpi-dev g++)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
# run N PROG ARGS...: on N ranks, oversubscribed, killed after 240 s
run() {
	n=$1; shift
	timeout -k 10 240 mpirun --quiet --oversubscribe -x ASAN_OPTIONS -np "$n" "$@"
}

for n in 1 2 4 8; do
	run "$n" "$t" >all.out 2>all.err || { cat all.out all.err; die "test_dist_dev at $n ranks failed"; }
	grep -q "^test_dist_dev: $n ranks (cuda): .* 0 failed over all ranks" all.out ||
		{ cat all.out all.err; die "test_dist_dev at $n ranks: no summary line"; }
	cat all.out
done

# The emulated NCCL said why each misused round failed (4 rounds, one line or more each).
[ "$(grep -c '^nccl-emu: ' all.err)" -ge 4 ] || { cat all.err; die "misuse: no nccl-emu lines"; }

# A backend without device collectives: refused on every rank by dist_dev_open.
run 2 "$t" cpu >cpu.out 2>cpu.err && rc=0 || rc=$?
[ "$rc" -ne 0 ] && grep -q "dist_dev_open: the cpu backend has no device collectives" cpu.err ||
	{ cat cpu.out cpu.err; die "cpu backend: not refused"; }

# moe-bench --device cuda --only=alltoall on the emulated device, with real 2DH (nodes of 2):
# its own check against the host MPI_Alltoall passes, and the JSON has the host mode's shape,
# a row per size (1 KiB to 64 MiB), naming the device and where MPI ran.
mb=$EMUTEST/moe-bench
if [ -x "$mb" ]; then
	run 4 "$mb" --device cuda --only=alltoall --local-size=2 -E 8 -M 16 -n 1 -w 0 -t 1 \
		>mb.out 2>mb.err || { cat mb.out mb.err; die "moe-bench --device cuda --only=alltoall failed"; }
	grep -q '^{"impl":"dist","only":"alltoall","device":"cuda","mpi_on":"host","W":4,"local_size":2,' mb.out ||
		{ cat mb.out; die "moe-bench: not the expected JSON head"; }
	[ "$(grep -o '"linear_ms"' mb.out | wc -l)" -eq 9 ] || { cat mb.out; die "moe-bench: not 9 sizes"; }
	grep -q 'mpi: MPI_Alltoall on host copies (the baseline)' mb.err || { cat mb.err; die "moe-bench: no baseline label"; }
	# the distributed layer on device memory (its exchanges through dist_dev, 2DH in nodes
	# of 2); MPI's All-to-All stays on host memory: --a2a mpi refused, exit 2, a line per rank
	run 4 "$mb" --device cuda --local-size=2 -T 16 -M 8 -H 8 -E 2 -n 2 -w 1 --r 2 --d 2 \
		--a2a 2dh >ly.out 2>ly.err || { cat ly.out ly.err; die "moe-bench: the layer on cuda failed"; }
	grep -q '^{"impl":"dist","only":"layer","device":"cuda",.*"plan":{"r":2,"d":2,"a":"2dh"}' ly.out ||
		{ cat ly.out; die "moe-bench: the layer on cuda: not the expected JSON"; }
	run 2 "$mb" --device cuda -T 16 -M 8 -H 8 -E 2 -n 1 -w 0 --a2a mpi >ly.out 2>ly.err && rc=0 || rc=$?
	[ "$rc" -eq 2 ] && [ "$(grep -c "^moe-bench: option '--a2a': mpi runs on host memory (cpu or ref), not on 'cuda'" ly.err)" -eq 2 ] ||
		{ cat ly.err; die "moe-bench: --a2a mpi on cuda under mpirun was not refused with exit 2 (got $rc)"; }
fi

real=${MPITEST:-}/test_dist_dev
if [ -n "${MPITEST:-}" ] && [ -x "$real" ]; then
	run 1 "$real" >real.out 2>real.err || { cat real.out real.err; die "test_dist_dev (real CUDA) failed"; }
	grep -Eq '^test_dist_dev: (skipped: |1 ranks \(cuda\): .* 0 failed)' real.out ||
		{ cat real.out real.err; die "test_dist_dev (real CUDA): neither passed nor skipped"; }
	cat real.out
fi
echo "dist-dev: device linear and 2dh at 1, 2, 4 and 8 ranks, byte-identical to MPI_Alltoall"
