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
# A resumed run keeps its optimisation (issue 10, item 5): a changed lr or seed is refused,
# naming the key; a longer schedule (train.steps) is allowed.
cp half.safetensors h2.safetensors
expect_fail 2 "^dpc-train-path: 'h2.safetensors': was trained with train.lr = 0.001, this run has 0.002: a resumed run keeps its optimisation .*--init or --weights start a new run from it\)$" \
	train -s train.lr=2e-3 -o h2.safetensors --resume
expect_fail 2 "^dpc-train-path: 'h2.safetensors': was trained with train.seed = 1, this run has 7:" \
	train -s train.seed=7 -o h2.safetensors --resume
same_file h2.safetensors half.safetensors
# --init branches a new run from a checkpoint: any settings (t-route-torch's paths do)
expect_ok train -s train.seed=7 -i half.safetensors -o h3.safetensors --until 101
expect_ok train -s train.steps=210 -o h2.safetensors --resume --until 101
# --weights starts at step 0 from the parameters alone, with any settings: at lr 1e-30 the
# parameters come out the same (to 1e-20), the step counts from 0, and the moments are fresh:
# after one step m = (1 - b1) g and v = (1 - b2) g^2, so v = (1 - b2) / (1 - b1)^2 m^2, which
# moments continued from the checkpoint would not satisfy.
expect_ok train -s train.lr=1e-30 -s train.steps=1 -w half.safetensors -o ft.safetensors
grep -q '"steps":1,"step":1,' out.stdout || die "--weights did not start at step 0: $(cat out.stdout)"
expect_fail 2 "^dpc-train-path: --weights starts a new run from a checkpoint's parameters: it does not go with --resume, which continue one$" \
	train -w half.safetensors -o ft.safetensors --resume
if [ -x /usr/bin/python3 ]; then
	/usr/bin/python3 - ft.safetensors half.safetensors <<'EOF' ||
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); hdr.pop("__metadata__", None)
    data = raw[8 + n:]
    def t(name):
        a, b = hdr[name]["data_offsets"]
        return struct.unpack("<%df" % ((b - a) // 4), data[a:b])
    return hdr, t
hdr, t = load(sys.argv[1])
_, t0 = load(sys.argv[2])
for name in hdr:
    if not name.startswith("optim."):
        assert max(abs(x - y) for x, y in zip(t(name), t0(name))) <= 1e-20, name
k, checked = (1 - 0.95) / (1 - 0.9) ** 2, 0
for name in hdr:
    if name.startswith("optim.exp_avg."):
        m, v = t(name), t("optim.exp_avg_sq." + name[len("optim.exp_avg."):])
        for x, y in zip(m, v):
            if abs(y) > 1e-20:
                assert abs(y - k * x * x) <= 1e-3 * abs(y), (name, x, y)
                checked += 1
assert checked > 1000, checked
EOF
		die "--weights: the parameters changed or the moments are not fresh"
fi

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
