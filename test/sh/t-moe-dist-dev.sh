# The distributed MoE layer on device memory (lib/moe/moe_dist.c over lib/dist/dist_dev.c):
# build/emu/test_moe_dist --device cuda under mpirun, the cuda backend run by the CPU emulator
# with NCCL emulated over MPI, at 2 and 4 ranks and at 4 in nodes of 2 (real 2DH): y, dx and
# every gradient shard equal the single-process layer's on ref (1e-5) for every r, d in
# {1, 2} and a in {linear, 2dh}; a = mpi is refused; switching plans allocates nothing.
# Each run three times: CUDA_EMU_STREAMS=eager, late-first and late-others (test/emu/emu.cpp),
# so that the pipeline's exchanges on the second stream (d = 2) are checked with the stream
# made first running as late as CUDA allows and then the second: an event missing between
# the experts and their exchanges leaves poisoned or stale rows in one of the two.
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

for mode in eager late-first late-others; do
for args in "2" "4" "4 --local-size 2"; do
	set -- $args
	n=$1; shift
	CUDA_EMU_STREAMS=$mode run "$n" "$t" --device cuda "$@" >all.out 2>&1 ||
		{ cat all.out; die "test_moe_dist --device cuda at $args ($mode) failed"; }
	[ "$(grep -c ' 0 failed$' all.out)" -eq "$n" ] ||
		{ cat all.out; die "test_moe_dist --device cuda at $args: not every rank passed"; }
	[ "$(grep -c 'the layer on cuda (device memory)$' all.out)" -eq "$n" ] ||
		{ cat all.out; die "test_moe_dist --device cuda at $args: the layer was not on cuda"; }
	grep -m1 'checks' all.out
done
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
# moe-bench end to end at d = 2, on one rank (the exchange is a copy to itself) and on two:
# the losses of the overlapped pipeline in each stream order equal those of the exchanges in
# order (--no-overlap) and timed one by one (--stage-times); only the timed run has exchange
# times (comm_ms is null when the device runs ahead)
if [ -x "$mb" ]; then
	shape="-T 16 -M 8 -H 8 -E 2 -t 1 --r 1 --d 2 -n 3 -w 0 --print-steps"
	for n in 1 2; do
		CUDA_EMU_STREAMS=eager run "$n" "$mb" --device cuda $shape --no-overlap >ref.out \
			2>ref.err || { cat ref.out ref.err; die "moe-bench --device cuda --no-overlap failed"; }
		grep 'STEP-' ref.err | sed 's/, step_time.*//' >ref.loss
		[ -s ref.loss ] || { cat ref.err; die "moe-bench --print-steps printed no loss"; }
		for v in "late-first" "late-others" "late-first --stage-times"; do
			set -- $v
			CUDA_EMU_STREAMS=$1 run "$n" "$mb" --device cuda $shape ${2:-} >v.out 2>v.err ||
				{ cat v.out v.err; die "moe-bench --device cuda at $n ranks ($v) failed"; }
			grep 'STEP-' v.err | sed 's/, step_time.*//' >v.loss
			cmp -s ref.loss v.loss || { paste ref.loss v.loss; die "moe-bench at $n ranks, d = 2 ($v): the losses differ from the exchanges in order"; }
			if [ -n "${2:-}" ]; then
				grep -q '"comm_ms":[0-9]' v.out || { cat v.out; die "--stage-times: no exchange time"; }
			else
				grep -q '"comm_ms":null' v.out || { cat v.out; die "overlapped: comm_ms is not null"; }
			fi
		done
	done
fi
# and the single-process benchmarks on the emulated device: the layer's step and the
# encode+decode kernels stay timed when the stages are not (a time of null here is a
# benchmark that measured nothing)
if [ -x "$mb" ]; then
	for only in layer encode-decode; do
		for dt in "" "--dtype bf16"; do
			[ $only = layer ] && [ -n "$dt" ] && continue
			"$mb" --device cuda --only=$only $dt -T 64 -M 16 -H 16 -E 4 -n 1 -w 0 >s.out 2>s.err ||
				{ cat s.out s.err; die "moe-bench --device cuda --only=$only $dt failed"; }
			grep -q '"step_ms":{"median":[0-9]' s.out ||
				{ cat s.out; die "moe-bench --device cuda --only=$only $dt: no step time"; }
			[ $only = layer ] || grep -q '"encdec_gbps":[0-9]' s.out ||
				{ cat s.out; die "moe-bench --device cuda --only=encode-decode $dt: no bandwidth"; }
		done
	done
fi
echo "test_moe_dist --device cuda (emulated) at 2 and 4 ranks and nodes of 2, the streams in three orders: every plan matches ref; moe-bench's overlapped d = 2 gives the losses of the exchanges in order"
