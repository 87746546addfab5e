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
# Progress in a log (issue 10, item 4): with stderr a file, a plain line per interval (here
# every step) giving this run's count, the global step, the loss, the last validation loss and
# rates with units; after a resume from 100 the bar counts from 1 while the step says 101.
# A run shorter than the interval (10 s by default) leaves the log empty.
more() { "$BIN/dpc-train-path" -c "$cfg" -s train.steps=120 -s train.eval_every=5 -d d/train.tok \
	-v d/val.tok -i half.safetensors -o more.safetensors -f >out.stdout 2>log.txt ||
	die "training with a log failed: $(cat log.txt)"; }
more
[ ! -s log.txt ] || die "a short run wrote progress: $(head -3 log.txt)"
DPC_PROGRESS_SECONDS=0 more
grep -q '^train  1/20 .* steps/s  eta .*  step 101/120  loss [0-9.]*  [0-9]* tok/s$' log.txt ||
	die "no first progress line in the log: $(head -3 log.txt)"
grep -q '^train  20/20 .*  step 120/120  loss [0-9.]*  val [0-9.]*  [0-9]* tok/s$' log.txt ||
	die "no last progress line with a validation loss: $(tail -3 log.txt)"
! grep -q "$(printf '\r')" log.txt || die "a carriage return in the log"
echo "200 straight == 100 + 100 resumed, bit for bit; progress lines in a log"
