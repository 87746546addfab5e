# scripts/dipaco-train.sh, the one-command run: under make -j2 and under mpirun with 3 worker
# ranks claiming tasks from the shared list, the same final modules bit for bit; a worker
# killed with SIGKILL ends the launch, and the same command finishes the run with those bits.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
root=$(cd "$TESTDIR/../.." && pwd)
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MPIRUN_ARGS="--oversubscribe"
make_corpus c.jsonl 80
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
# run ENGINE N RUNDIR: the whole run with "-j N" or "--mpi N"
run() {
	sh "$root/scripts/dipaco-train.sh" --bin "$BIN" -s model.n_embd=64 -s model.n_head=2 \
		-s model.seq_len=32 -s train.batch_size=2 -s train.warmup_steps=2 \
		-s train.eval_batches=1 -s dipaco.phases=3 -s dipaco.inner_steps=30 \
		-s train.steps=90 "$1" "$2" "$root/configs/dipaco-2x2.yaml" "$3" d/train.tok d/val.tok
}
run -j 2 viamake >make.out 2>&1 || { cat make.out; die "the make run failed"; }
grep -Eq '^ +3 +4/4 ' make.out || { cat make.out; die "no table line for phase 3"; }

# A worker's training task killed in phase 2: the launch fails, the rerun completes.
run --mpi 3 viampi >mpi1.out 2>&1 &
pid=$!
i=0
while [ $i -lt 1000 ] && ! ls viampi/phase-0002/paths/*.jsonl.part >/dev/null 2>&1; do
	sleep 0.01; i=$((i + 1))
done
kill_task . "--run viampi --phase 2 --path" || die "no phase-2 training task to kill"
wait "$pid" && die "the launch succeeded although a worker's task was killed"
run --mpi 3 viampi >mpi2.out 2>&1 || { cat mpi2.out; die "the rerun under mpirun failed"; }
for m in lower.0 lower.1 upper.0 upper.1; do
	same_file "viamake/phase-0003/modules/$m.safetensors" "viampi/phase-0003/modules/$m.safetensors"
done
[ ! -e viampi/claims ] || die "the finished launch left its claims"
echo "make -j2 and mpirun -np 3 (killed once, rerun): the same final modules, bit for bit"

# --device and --precision reach every training task, under make and under mpirun: the cpu
# has no tf32 products, so the first task refuses in dpc-train-path's own words
for engine in "-j 2" "--mpi 2"; do
	rm -rf viaprec
	# shellcheck disable=SC2086
	sh "$root/scripts/dipaco-train.sh" --bin "$BIN" -s model.n_embd=64 -s model.n_head=2 \
		-s model.seq_len=32 -s train.batch_size=2 -s dipaco.phases=1 -s dipaco.inner_steps=2 \
		-s train.steps=2 $engine --device cpu --precision tf32 -q \
		"$root/configs/dipaco-2x2.yaml" viaprec d/train.tok d/val.tok >prec.out 2>&1 &&
		die "a tf32 run on the cpu succeeded ($engine)"
	grep -q "^dpc-train-path: device 'cpu' has no tf32 matrix products (it has: fp32, bf16)$" \
		prec.out ||
		{ cat prec.out; die "the tf32 run ($engine) did not fail in dpc-train-path's words"; }
	! ls viaprec/phase-0001/paths/*.safetensors >/dev/null 2>&1 ||
		die "the refused run ($engine) wrote a path checkpoint"
done
echo "--device cpu --precision tf32 reach the tasks under make and mpirun (refused by the cpu)"
