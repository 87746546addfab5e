# t-torch-moe.sh - the MoE GPT (dpc-config(5) MOE) against the independent PyTorch reference
# (test/ref/gpt2_torch.py, whose MoE block is written from lib/moe/moe.h's comment): for three
# MoE configurations, (a) the --eval loss of a checkpoint, (b) one training step from a
# checkpoint with non-trivial AdamW moments: the step's loss, auxiliary loss and grad norm,
# then every parameter, update and moment (the moments carry each step's gradient:
# exp_avg = b1 m + (1 - b1) g), with the tolerances of t-torch-reference.sh:
#   drops      E=4 top-2 in both blocks, capacity 1 (the routing drops choices: the count is
#              printed and must be > 0), plus the selfcheck: the comparison fails for an
#              expert with one slot more, the auxiliary loss left out of the objective and
#              unrenormalised scores;
#   no drops   E=3 top-1 in block 1 only (moe.blocks), capacity 0 (nothing dropped: checked);
#   bpr        E=4 top-2 in block 0 only (moe.blocks), capacity 0.5 with batch-prioritized
#              routing (the slots go to the highest gates first; the selfcheck fails slots
#              in token order).
# In each, the step's "moe" events of metrics.jsonl (per MoE block: the capacity, the largest
# expert count and the dropped choices) must equal the reference's routing. Evaluation drops
# nothing (capacity setting 0, gpt2.h), so (a) does not depend on how the two sides batch
# their windows.
# Skips (77) without PyTorch in /usr/bin/python3 or without the programs.
set -eu
. "$TESTDIR/lib.sh"

PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
REF="$ROOT/test/ref/gpt2_torch.py"
need_torch
for p in dpc-train-path dpc-shard; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done

. "$TESTDIR/corpus.sh"
make_corpus docs.jsonl 40
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 docs.jsonl data
TOK=data/train.tok
# configs/gpt-small-test.yaml's model and optimizer (L=2 C=32 NH=2 T=32 V=256 B=4), with the
# overrides of t-torch-reference.sh that put the compared step on the cosine branch with
# clipping acting
CFG="$ROOT/configs/gpt-small-test.yaml"
TRAIN="train.steps=4 train.warmup_steps=2 train.lr=1e-2 train.grad_clip=0.5 train.eval_every=0
train.checkpoint_every=0"

# case NAME MUTANTS MOE-OVERRIDES...: (a) and (b) for one configuration; MUTANTS (comma-
# separated, or -) are run through the reference's selfcheck, which must detect each.
case_moe() {
	name=$1 mutants=$2
	shift 2
	sets=""
	for s in $TRAIN "$@"; do sets="$sets -s $s"; done
	echo "== $name: $*"
	# shellcheck disable=SC2086
	expect_ok "$BIN/dpc-train-path" -c "$CFG" $sets -d "$TOK" -t 1 -q -o "$name-ck3.st" -u 3
	expect_ok "$BIN/dpc-train-path" --eval "$name-ck3.st" -d "$TOK"
	cp out.stdout "$name-eval-ours.json"
	"$PY" "$REF" loss "$name-ck3.st" "$TOK" >"$name-eval-ref.json" || die "$name: reference loss failed"
	"$PY" - "$name-eval-ours.json" "$name-eval-ref.json" <<'EOF' || die "$name: (a) evaluation loss differs"
import json, sys
o = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r = json.loads(open(sys.argv[2]).read())
rel = abs(o["loss"] - r["loss"]) / abs(r["loss"])
print(f"(a) eval: ours {o['loss']:.9g}, reference {r['loss']:.9g} over {r['tokens']} tokens: "
      f"rel diff {rel:.3e} (limit 1e-5)")
sys.exit(0 if rel <= 1e-5 and o["tokens"] == r["tokens"] else 1)
EOF
	# shellcheck disable=SC2086
	expect_ok "$BIN/dpc-train-path" -c "$CFG" $sets -d "$TOK" -t 1 -q -i "$name-ck3.st" -u 4 \
		-o "$name-ours4.st" -m "$name-metrics.jsonl"
	# shellcheck disable=SC2086
	"$PY" "$REF" step "$name-ck3.st" "$TOK" "$name-ref4.st" -c "$CFG" $sets \
		>"$name-step-ref.json" || die "$name: reference step failed"
	"$PY" - "$name-metrics.jsonl" "$name-step-ref.json" "$name" <<'EOF' || die "$name: (b) step scalars differ"
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1]) if '"event":"train"' in l][-1]
ref = json.loads(open(sys.argv[2]).read())
ok = True
for key in ("loss", "aux_loss", "grad_norm", "lr"):
    rel = abs(ours[key] - ref[key]) / max(abs(ref[key]), 1e-30)
    ok &= rel <= 1e-5
    print(f"(b) {key:9s} ours {ours[key]:.9g} reference {ref[key]:.9g} rel diff {rel:.3e}")
drops = [r["dropped"] for r in ref["moe_routes"]]
print(f"    the reference's routing: capacity {[r['C'] for r in ref['moe_routes']]}, largest "
      f"expert count {[r['need'] for r in ref['moe_routes']]}, dropped {drops}")
# the step's "moe" events (one per MoE block, in block order): the same routing
moe = [json.loads(l) for l in open(sys.argv[1]) if '"event":"moe"' in l]
moe = [m for m in moe if m["step"] == ours["step"]]
got = [(m["capacity"], m["need"], m["dropped"]) for m in moe]
want = [(r["C"], r["need"], r["dropped"]) for r in ref["moe_routes"]]
print(f"    ours (metrics.jsonl moe events): capacity, need, dropped {got}")
ok &= got == want
if sys.argv[3] == "drops" and not sum(drops):
    ok = False
    print("    nothing dropped: the case does not test drops")
if sys.argv[3] == "nodrops" and sum(drops):
    ok = False
    print("    capacity 0 dropped choices")
sys.exit(0 if ok else 1)
EOF
	"$PY" "$REF" compare "$name-ours4.st" "$name-ref4.st" --base "$name-ck3.st" --all >"$name-cmp.out" 2>&1 ||
		{ cat "$name-cmp.out"; die "$name: (b) parameters after one step differ from the reference"; }
	tail -n 1 "$name-cmp.out"
	if [ "$mutants" != - ]; then
		# shellcheck disable=SC2086
		"$PY" "$REF" selfcheck "$name-ck3.st" "$TOK" -c "$CFG" $sets --mutants "$mutants" \
			>"$name-self.out" 2>&1 || { cat "$name-self.out"; die "$name: selfcheck failed"; }
		grep -E 'moe_|fp32|selfcheck' "$name-self.out"
	fi
}

case_moe drops moe_capacity_plus_one,moe_no_aux,moe_no_renorm moe.experts=4 moe.top_k=2 \
	moe.every=1 moe.capacity_factor=1.0
case_moe nodrops - moe.experts=3 moe.top_k=1 moe.blocks=1 moe.capacity_factor=0
case_moe bpr moe_capacity_plus_one,moe_no_bpr moe.experts=4 moe.top_k=2 moe.blocks=0 \
	moe.capacity_factor=0.5 moe.bpr=true moe.aux_weight=0.1
echo "t-torch-moe: ok"
