# The distributed MoE layer on device memory (lib/moe/moe_dist.c over lib/dist/dist_dev.c):
# build/emu/test_moe_dist --device cuda under mpirun, the cuda backend run by the CPU emulator
# with NCCL emulated over MPI, at 2 and 4 ranks and at 4 in nodes of 2 (real 2DH): y, dx and
# every gradient shard equal the single-process layer's on ref (1e-5) for every r, d in
# {1, 2} and a in {linear, 2dh}; a = mpi is refused; switching plans allocates nothing.
# Sizes are small: the emulator runs every CUDA thread on the CPU.
set -eu
. "$TESTDIR/lib.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
t=${EMUTEST:-}/test_moe_dist
[ -n "${EMUTEST:-}" ] && [ -x "$t" ] ||
	skip "skipped: no emulated device test (EMUTEST; needs MPI and a C++ compiler: apt-get install libopenmpi-dev g++)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
run() { mpi_run "$@"; } # lib.sh

for args in "2" "4" "4 --local-size 2"; do
	set -- $args
	n=$1; shift
	run "$n" "$t" --device cuda "$@" >all.out 2>&1 ||
		{ cat all.out; die "test_moe_dist --device cuda at $args failed"; }
	[ "$(grep -c ' 0 failed$' all.out)" -eq "$n" ] ||
		{ cat all.out; die "test_moe_dist --device cuda at $args: not every rank passed"; }
	[ "$(grep -c 'the layer on cuda (device memory)$' all.out)" -eq "$n" ] ||
		{ cat all.out; die "test_moe_dist --device cuda at $args: the layer was not on cuda"; }
	grep -m1 'checks' all.out
done
# moe-profile measures a dictionary of the layer on the emulated device, and moe-bench
# --dict runs it there (the cuda layer end to end through the programs)
mp=$EMUTEST/moe-profile mb=$EMUTEST/moe-bench
if [ -x "$mp" ] && [ -x "$mb" ]; then
	shape="-T 16 -M 8 -H 8 -E 2 -t 1"
	run 4 "$mp" --device cuda --local-size 2 $shape -R 8 --factors 1:2 --d-values 1,2 -n 1 -w 0 \
		-o d.txt >mp.out 2>mp.err || { cat mp.out mp.err; die "moe-profile --device cuda failed"; }
	grep -q '^world 4$' d.txt || { cat d.txt; die "moe-profile --device cuda: no 'world 4' in the dictionary"; }
	run 4 "$mb" --device cuda --local-size 2 $shape --dict d.txt -n 1 -w 0 >mb.out 2>mb.err ||
		{ cat mb.out mb.err; die "moe-bench --device cuda --dict failed"; }
	grep -q '"run":"dictionary-summary"' mb.out || { cat mb.out; die "moe-bench --device cuda --dict: no summary"; }
fi
echo "test_moe_dist --device cuda (emulated) at 2 and 4 ranks and nodes of 2: every plan matches ref"
