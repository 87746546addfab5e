# Resume is exact: 200 steps straight and 100 + resume 100 give bit-identical checkpoints.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
cfg=$TESTDIR/../../configs/gpt-small-test.yaml
make_corpus c.jsonl 60
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
train() { "$BIN/dpc-train-path" -q -c "$cfg" -s train.steps=200 -d d/train.tok -v d/val.tok "$@"; }
expect_ok train -o straight.safetensors
expect_ok train -o split.safetensors --until 100
cp split.safetensors half.safetensors
expect_ok train -o split.safetensors --resume
cmp -s half.safetensors split.safetensors && die "resuming did not change the checkpoint"
same_file straight.safetensors split.safetensors
# and the resumed run reports the step it reached
grep -q '"step":200' out.stdout || die "summary does not say step 200: $(cat out.stdout)"
echo "200 straight == 100 + 100 resumed, bit for bit"
