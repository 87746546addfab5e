# t-route-torch.sh - dpc-route against the independent PyTorch reference
# (test/ref/route_torch.py): prefix features (two blocks), per-token and per-document scores
# of three paths, and evaluation with test-time routing (a logistic-regression and a k-means
# document router, two window routers of different W, context and block, and a transformer
# window router: the base fine-tuned with a head over the paths), all recomputed from the
# checkpoints and the token file in float64; the transformer router's training labels (the
# best path for the next L tokens at every position) counted from the scores.
#
# The model is configs/gpt-small-test.yaml (L=2 C=32 T=32 V=256): a base trained a few steps
# on a mixed corpus, and three paths trained further from it, on words, on numbers and on the
# mix with another seed. The routed corpus has documents shorter than the prefix (8), of
# exactly the prefix and one more, around the context (31 .. 33, 64, 65) and up to 200 tokens
# (several windows of seq_len 32, so the windowed contexts of lm.h and the window routers'
# boundaries matter).
#
# Tolerances (route_torch.py): features max|a-b| / max|b| <= 1e-5; logprob elementwise
# |a-b| <= 1e-4 + 1e-5|b|; doc_logprob elementwise |a-b| <= 1e-5|b| (+ 1e-6); eval: tokens and
# switches equal, loss within 1e-5 relative. The float32 forward stays far inside these (the
# figures are printed); the test also shows that the comparisons fail on features of another
# block, on scores of paths in another order and on an evaluation with the paths swapped.
# Skips (77) without PyTorch in /usr/bin/python3 or without the programs.
set -eu
. "$TESTDIR/lib.sh"

PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
REF="$ROOT/test/ref/route_torch.py"
need_torch
"$PY" "$REF" selftest >selftest.out 2>&1 || { cat selftest.out; die "route_torch.py selftest"; }
tail -n 1 selftest.out
for p in dpc-route dpc-train-path dpc-shard; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
CFG="$ROOT/configs/gpt-small-test.yaml"
[ -f "$CFG" ] || skip "skipped: no $CFG"

# Corpora (byte tokens): words, numbers, and the routed corpus of both kinds at set lengths.
"$PY" - <<'EOF'
import json, random
words = ("the of and to in a is that for it as was with be by on not he this are or his "
         "from at which but have an they you were her she there one all we their been has "
         "model path module router shard token level expert capacity gate").split()
rng = random.Random(3)
def text(kind, n):
    s = ""
    while len(s) < n:
        if kind == "w":
            s += rng.choice(words) + rng.choice("  ,.")
        else:
            s += str(rng.randint(0, 999)) + rng.choice("+-*= ;")
    return s[:n]
def write(path, docs):
    with open(path, "w") as f:
        for i, (k, n) in enumerate(docs):
            f.write(json.dumps({"id": f"{k}{i}", "text": text(k, n)}) + "\n")
write("words.jsonl", [("w", rng.randint(40, 300)) for _ in range(40)])
write("numbers.jsonl", [("n", rng.randint(40, 300)) for _ in range(40)])
lens = [3, 5, 7, 8, 9, 12, 20, 31, 32, 33, 40, 63, 64, 65, 100, 150, 200]
docs = [(k, n) for n in lens for k in "wn"] + [(rng.choice("wn"), rng.randint(10, 200))
                                               for _ in range(30)]
rng.shuffle(docs)
write("route.jsonl", docs)
EOF
cat words.jsonl numbers.jsonl >mixed.jsonl
for c in words numbers mixed route; do
	expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 "$c.jsonl" "$c"
done
TOK=route/train.tok

# The base and three paths.
train() {
	expect_ok "$BIN/dpc-train-path" -c "$CFG" -s train.steps=60 -s train.warmup_steps=2 \
		-s train.lr=1e-2 -t 2 -q "$@"
}
train -d mixed/train.tok -o base.safetensors -u 20
train -d words/train.tok -i base.safetensors -o p0.safetensors -u 40
train -d numbers/train.tok -i base.safetensors -o p1.safetensors -u 40
train -d mixed/train.tok -s train.seed=7 -i base.safetensors -o p2.safetensors -u 40
PATHS="--path p0.safetensors --path p1.safetensors --path p2.safetensors"
REFPATHS="p0.safetensors p1.safetensors p2.safetensors"

route() { expect_ok "$BIN/dpc-route" "$@" -q; }
route features -m base.safetensors --prefix 8 -o F.st "$TOK"
route features -m base.safetensors --prefix 8 --layer 0 -o F0.st "$TOK"
# shellcheck disable=SC2086
route score $PATHS --prefix 8 -o S.st "$TOK"
route kmeans -k 3 -o K.st F.st
route fit --scores S.st --features F.st -o R.st "$TOK"
route fit --scores S.st --window 12 -m base.safetensors -o W12.st "$TOK"
route fit --scores S.st --window 40 --context 20 --layer 0 -m base.safetensors -o W40.st "$TOK"
route fit --scores S.st --window 12 --transformer --target-len 20 --steps 40 -t 2 \
	-m base.safetensors -o T12.st "$TOK"
cp out.stdout T12.json
# shellcheck disable=SC2086
route eval $PATHS -m base.safetensors --router R.st --window-router W12.st \
	--window-router W40.st --window-router T12.st --json E.json "$TOK"
sed 's/^/    /' out.stdout
# shellcheck disable=SC2086
route eval $PATHS -m base.safetensors --router K.st --window-router W40.st \
	--window-router W12.st --json EK.json "$TOK"

ref() { "$PY" "$REF" "$@"; }
echo "features, last block:"
ref compare-features F.st base.safetensors "$TOK" --prefix 8 --layer 1 ||
	die "prefix features (block 1) differ from the reference"
echo "features, block 0:"
ref compare-features F0.st base.safetensors "$TOK" --prefix 8 --layer 0 ||
	die "prefix features (block 0) differ from the reference"
echo "scores:"
# shellcheck disable=SC2086
ref compare-scores S.st "$TOK" $REFPATHS --prefix 8 || die "scores differ from the reference"
echo "transformer window router: its labels (L = 20) counted from the scores:"
"$PY" - "$ROOT/test/ref" S.st "$TOK" T12.json <<'EOF' || die "the transformer router's labels differ"
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import gpt2_torch as g2
t, _ = g2.st_read(sys.argv[2])
lp = t["logprob"].astype(np.float64)
_, offs, _ = g2.read_tokfile(sys.argv[3])
L, counts = 20, np.zeros(lp.shape[1], dtype=np.int64)
for d in range(len(offs) - 1):
    s0, e = int(offs[d]), int(offs[d + 1])
    for k in range(s0, e):
        counts[int(np.argmax(lp[k:min(k + L, e)].sum(0)))] += 1
ours = json.load(open(sys.argv[4]))["report"]["label_counts"]
print(f"  ours {ours}, counted {counts.tolist()}")
sys.exit(0 if ours == counts.tolist() else 1)
EOF
echo "eval, logreg document router, window routers W=12 and W=40, transformer W=12:"
# shellcheck disable=SC2086
ref compare-eval E.json "$TOK" base.safetensors R.st W12.st W40.st T12.st $PATHS ||
	die "eval (logreg router) differs from the reference"
echo "eval, k-means document router, window routers W=40 and W=12:"
# shellcheck disable=SC2086
ref compare-eval EK.json "$TOK" base.safetensors K.st W40.st W12.st $PATHS ||
	die "eval (k-means router) differs from the reference"

# The comparisons can fail.
must_fail() {
	what=$1; shift
	ref "$@" >neg.out 2>&1 && rc=0 || rc=$?
	[ "$rc" -eq 1 ] || { cat neg.out; die "$what: the comparison exited $rc, expected 1"; }
	grep -q "FAIL:" neg.out || { cat neg.out; die "$what: no FAIL line"; }
	echo "$what: fails as it must ($(grep -m 1 'FAIL:' neg.out | sed 's/^ *//'))"
}
must_fail "block-0 features compared as block 1" \
	compare-features F0.st base.safetensors "$TOK" --prefix 8 --layer 1
grep -q "features differ" neg.out || { cat neg.out; die "the values were not found to differ"; }
must_fail "scores compared with paths 0 and 1 swapped" \
	compare-scores S.st "$TOK" p1.safetensors p0.safetensors p2.safetensors --prefix 8
must_fail "eval compared with paths 0 and 1 swapped" \
	compare-eval E.json "$TOK" base.safetensors R.st W12.st W40.st T12.st \
	--path p1.safetensors --path p0.safetensors --path p2.safetensors
echo "ok"
