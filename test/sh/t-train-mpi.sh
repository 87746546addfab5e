# dpc-train-path under mpirun: data parallel for the dense parameters, expert parallel for the
# MoE blocks (gpt2_distribute). Against one process on the whole batch, 20 steps, losses to
# 1e-5 (metrics.jsonl): a dense model at 2 ranks; an MoE model without drops and without an
# auxiliary loss (where the distributed layer's math is the single-process layer's) at 2 and 4
# ranks under static plans (expert parallel, data parallel r = 0, pipelined 2DH) and under a
# dictionary moe-profile measured; the checkpoint (rank 0's) continues under --resume to the
# straight run's bits. The refusals: one line per rank, exit 2, nothing written: a batch
# that does not split, experts that do not fit the ranks, a plan the placement has not, a
# malformed --moe-plan, --moe-plan without mpirun, a dictionary of another world.
set -eu
. "$TESTDIR/lib.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
[ -n "${MPITEST:-}" ] || skip "skipped: a build without MPI (apt-get install libopenmpi-dev)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Open MPI frees little at MPI_Finalize: LeakSanitizer would call it leaks (see t-dist.sh).
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
PY=${PY:-/usr/bin/python3}
. "$TESTDIR/corpus.sh"
make_corpus corpus.jsonl 60
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 corpus.jsonl data
tok=data/train.tok

# configs/gpt-small-test.yaml: L=2 C=32 NH=2 T=32, B=4 (2 rows a rank at 2 ranks, 1 at 4)
dense="-c $TESTDIR/../../configs/gpt-small-test.yaml -s train.steps=20 -s train.eval_every=0 -s train.batch_size=4"
moe="$dense -s moe.experts=4 -s moe.top_k=2 -s moe.every=2 -s moe.capacity_factor=0 -s moe.aux_weight=0 -s moe.gate_noise=0.5"

# same_losses A.jsonl B.jsonl WHAT: every train event's loss within 1e-5 (relative)
same_losses() {
	"$PY" - "$1" "$2" "$3" <<'EOF' || die "$3: the losses differ from one process's"
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"event":"train"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[3]}: 20 losses, largest relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
EOF
}

one() { # one NAME ARGS...: the single-process run
	nm=$1; shift
	expect_ok "$BIN/dpc-train-path" "$@" -d $tok -t 1 -q -o "$nm.st" -m "$nm.jsonl"
}
ranks() { # ranks W NAME ARGS...: the same under mpirun (mpi_run sets n: not used here)
	w=$1 nm=$2; shift 2
	mpi_run "$w" "$BIN/dpc-train-path" "$@" -d $tok -t 1 -q -o "$nm.st" -m "$nm.jsonl" \
		>"$nm.out" 2>"$nm.err" || { cat "$nm.err"; die "$nm: mpirun -np $w failed"; }
	[ "$(wc -l <"$nm.out")" -eq 1 ] || { cat "$nm.out"; die "$nm: expected rank 0's JSON line only"; }
	grep -q "\"ranks\":$w" "$nm.out" || die "$nm: the JSON does not say $w ranks"
}

one dense1 $dense
ranks 2 dense2 $dense
same_losses dense1.jsonl dense2.jsonl "dense, 2 ranks"

one moe1 $moe
for case in "2 1,1,linear" "4 1,1,linear" "4 0,1,linear" "4 1,2,2dh" "2 1,4,mpi"; do
	set -- $case
	ranks "$1" "moe$1-$2" $moe --moe-plan "$2"
	grep -q "\"r\":${2%%,*}" "moe$1-$2.jsonl" || die "moe$1-$2: the plan is not in the metrics"
	same_losses moe1.jsonl "moe$1-$2.jsonl" "MoE, $1 ranks, plan $2"
done

# a dictionary for this layer (M = 32, H = 128, E = 4, k = 2, 64 tokens per rank) at 2 ranks
expect_ok mpi_run 2 "$BIN/moe-profile" -T 64 -M 32 -H 128 -E 4 -k 2 --activation gelu -R 8 \
	--factors 1:3 -n 1 -w 1 -o dict.txt
ranks 2 moedict $moe --moe-dict dict.txt
grep -q '"moe_plan":"dictionary"' moedict.out || die "the JSON does not name the dictionary"
same_losses moe1.jsonl moedict.jsonl "MoE, 2 ranks, a dictionary"

# rank 0's checkpoint carries the run on: 10 steps, then --resume to 20, the straight run's
# bits (the parameters and moments are the same on every rank, checked at each checkpoint)
ranks 2 half $moe --moe-plan 1,1,linear --until 10
mpi_run 2 "$BIN/dpc-train-path" $moe --moe-plan 1,1,linear -d $tok -t 1 -q -o half.st \
	-m half.jsonl --resume >/dev/null 2>half.err || { cat half.err; die "--resume failed"; }
"$PY" "$TESTDIR/stcmp.py" half.st "moe2-1,1,linear.st" ||
	die "resumed at step 10 under mpirun: not the straight run's checkpoint"

# refusals: exit 2, one line per rank
refuse() { # refuse W PATTERN ARGS...
	w=$1 pat=$2; shift 2
	mpi_run "$w" "$BIN/dpc-train-path" "$@" -d $tok -t 1 -q -o refused.st \
		>out.stdout 2>out.stderr && rc=0 || rc=$?
	[ "$rc" = 2 ] || { cat out.stderr; die "$*: exit $rc, expected 2"; }
	[ "$(wc -l <out.stderr)" -eq "$w" ] || { cat out.stderr; die "$*: expected $w lines"; }
	[ "$(grep -Ec -- "$pat" out.stderr)" -eq "$w" ] ||
		{ cat out.stderr; die "$*: not every line matches '$pat'"; }
	[ ! -e refused.st ] || die "$*: wrote refused.st"
}
refuse 3 "^dpc-train-path: train.batch_size = 4 does not split over 3 ranks" $moe
refuse 2 "^dpc-train-path: moe.experts = 3 on 2 ranks: " $moe -s moe.experts=3
refuse 2 "^dpc-train-path: the MoE plan: r=2 is not a parallelism degree" $moe --moe-plan 2,1,linear
refuse 2 "^dpc-train-path: option '--moe-plan': '1,linear' is not R,D,A" $moe --moe-plan 1,linear
expect_ok mpi_run 4 "$BIN/moe-profile" -T 32 -M 32 -H 128 -E 4 -k 2 --activation gelu -R 8 \
	--factors 1:2 -n 1 -w 1 -o dict4.txt
refuse 2 "^dpc-train-path: 'dict4.txt': measured for W=4 ranks, this run has W=2" $moe --moe-dict dict4.txt
expect_fail 2 "^dpc-train-path: --moe-plan chooses how the MoE blocks run across ranks" \
	"$BIN/dpc-train-path" $moe -d $tok -o refused.st --moe-plan 1,1,linear
[ ! -e refused.st ] || die "--moe-plan without mpirun wrote refused.st"
echo "ok: dense and MoE training at 2 and 4 ranks equal one process's; refusals"
