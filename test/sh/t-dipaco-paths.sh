# A DiPaCo path checkpoint is a plain GPT-2 checkpoint, and early stopping publishes the
# parameters of the best held-out evaluation:
#   (1) without early stopping every heldout field is null and best_step is the last step;
#   (2) with early stopping (dipaco.early_stop_every 2, a high lr so that the held-out loss
#       turns up within a phase) the heldout events come every 2 steps and at the end,
#       best_step is the argmin of their losses, the checkpoint's best_step metadata says so
#       while its step stays t*tau, the published parameters evaluate (dpc-train-path --eval
#       on the held-out slice of the shard) to the reported best loss, and against a run that
#       evaluates only at the end (same training, best_step = last) the AdamW moments are the
#       same bits and the parameters differ exactly where best_step < last;
#   (3) a phase-2 path checkpoint evaluates the same with dpc-train-path --eval as with the
#       independent PyTorch reference test/ref/gpt2_torch.py (relative 1e-6). Without PyTorch
#       this part alone is skipped: (1) and (2) run first, and then the test exits 77.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
cfgdir=$TESTDIR/../../configs
ROOT=$(cd "$TESTDIR/../.." && pwd)
PY=/usr/bin/python3
O=$BIN/dpc-outer
T=$BIN/dpc-train-path
[ -x "$PY" ] || skip "skipped: $PY missing (reads checkpoint metadata and metrics)"
make_corpus c.jsonl 60
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
# B=2, T=32; eval_batches 2: every evaluation of a path is over 2*2*32 = 128 tokens
B=2 SEQ=32 EB=2
small="-s model.n_embd=32 -s model.n_head=2 -s model.seq_len=$SEQ -s train.batch_size=$B
       -s train.warmup_steps=2 -s train.eval_batches=$EB -s dipaco.phases=2"
# run DIR TAU [-s K=V]...: a 2x2 run of 2 phases of TAU steps on one thread (the steps' bits
# depend on the thread count), every task run by hand, each task's JSON line kept in
# DIR.task-T-P.json
run() {
	dir=$1 tau=$2
	shift 2
	# shellcheck disable=SC2086
	expect_ok "$O" init -c "$cfgdir/dipaco-2x2.yaml" $small -s dipaco.inner_steps="$tau" \
		-s train.steps=$((2 * tau)) "$@" "$dir"
	expect_ok "$BIN/dpc-shard" split -q --random 4 --seed 3 d/train.tok "$dir/shards"
	for t in 1 2; do
		for p in 0 1 2 3; do
			expect_ok "$T" -q -t 1 --run "$dir" --phase $t --path $p
			cp out.stdout "$dir.task-$t-$p.json"
		done
		expect_ok "$O" step "$dir" --phase $t -q -t 1
	done
}
ckpt() { echo "$1/phase-000$2/paths/path-00$3.safetensors"; }

# ---- (1) early stopping off ----------------------------------------------------------------
run P 4
"$PY" - P 4 <<'EOF' || die "(1) early stopping off: heldout fields or best_step wrong"
import json, struct, sys
d, tau = sys.argv[1], int(sys.argv[2])
def meta(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])["__metadata__"]
for t in (1, 2):
    for p in range(4):
        ev = [json.loads(l) for l in open(f"{d}/phase-000{t}/paths/path-00{p}.jsonl")]
        task = json.loads(open(f"{d}.task-{t}-{p}.json").read())
        m = meta(f"{d}/phase-000{t}/paths/path-00{p}.safetensors")
        summ = [e for e in ev if e["event"] == "path"]
        held = [e for e in ev if e["event"] == "heldout"]
        assert len(summ) == 1 and ev[-1] is summ[0], f"{t}/{p}: one path event, last"
        s = summ[0]
        assert not held, f"{t}/{p}: heldout events without early stopping: {held}"
        assert s["heldout_loss"] is None and task["heldout_loss"] is None, f"{t}/{p}: {s} {task}"
        assert s["step"] == s["best_step"] == task["best_step"] == t * tau, f"{t}/{p}: {s}"
        assert m["step"] == m["best_step"] == str(t * tau), f"{t}/{p}: metadata {m}"
print("(1) early stopping off: no heldout events, heldout_loss null, best_step = step = t*tau")
EOF

# ---- (2) early stopping --------------------------------------------------------------------
# tau 9 (odd, so the evaluation after the last step is not one of the every-2 ones), lr 3e-2:
# with these data the held-out loss of several paths turns up before the end of a phase.
es="-s dipaco.early_stop_every=2 -s dipaco.holdout_frac=0.2 -s train.lr=3e-2"
# shellcheck disable=SC2086
run E 9 $es
# the same run evaluating only after the last step: the same training, best_step = 9
# shellcheck disable=SC2086
run E9 9 $es -s dipaco.early_stop_every=9
# held-out slices: the last floor(ntokens * 0.2) tokens of each shard, as a one-document token
# file (dpc-tokens(5)) written here, so that --eval can read exactly what pathtrain evaluated
for p in 0 1 2 3; do
	"$PY" - E/shards/shard-00$p.tok held-$p.tok 0.2 <<'EOF' || die "cannot cut held-out tokens"
import struct, sys, zlib
src, dst, frac = sys.argv[1], sys.argv[2], float(sys.argv[3])
raw = open(src, "rb").read()
magic, ver, vocab, ndocs, ntok, width = struct.unpack("<8sIIQQI", raw[:36])
assert magic == b"DPCTOKS\0" and ver == 2, "not a version-2 token file"
nheld = int(ntok * frac)    # (uint64_t)((double)ntokens * holdout_frac), as pathtrain.c
toks = raw[64 + (ntok - nheld) * width:64 + ntok * width]
meta = b"{}"
body = toks + bytes(-len(toks) % 8) + struct.pack("<4Q", 0, nheld, 0, len(meta)) + meta
# written as version 1 (no tokenizer recorded), which readers still take
hdr = struct.pack("<8sIIQQIIQ12x", b"DPCTOKS\0", 1, vocab, 1, nheld, width, zlib.crc32(body),
                  len(meta))
open(dst, "wb").write(hdr + struct.pack("<I", zlib.crc32(hdr)) + body)
print(f"held-out slice of {src}: tokens {ntok - nheld}..{ntok - 1}")
EOF
	expect_ok "$BIN/dpc-shard" info held-$p.tok
done
# every published checkpoint on its held-out slice, over pathtrain's evaluation windows
# (train_evaluate with at most eval_batches * B * T tokens)
for t in 1 2; do
	for p in 0 1 2 3; do
		expect_ok "$T" --eval "$(ckpt E $t $p)" -d held-$p.tok --max-tokens $((EB * B * SEQ))
		cp out.stdout eval-$t-$p.json
	done
done
"$PY" - E E9 9 <<'EOF' || die "(2) early stopping"
import json, struct, sys
d, d9, tau = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__")
    data = raw[8 + n:]
    return meta, {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items()}
early = 0
for t in (1, 2):
    first, last = (t - 1) * tau, t * tau
    for p in range(4):
        what = f"phase {t} path {p}"
        ev = [json.loads(l) for l in open(f"{d}/phase-000{t}/paths/path-00{p}.jsonl")]
        task = json.loads(open(f"{d}.task-{t}-{p}.json").read())
        held = [e for e in ev if e["event"] == "heldout"]
        s = [e for e in ev if e["event"] == "path"][0]
        want = list(range(first + 2, last + 1, 2)) + ([last] if tau % 2 else [])
        got = [e["step"] for e in held]
        assert got == want, f"{what}: heldout events at steps {got}, expected {want}"
        assert all(e["phase"] == t and e["path"] == p for e in held), f"{what}: {held}"
        best = min(held, key=lambda e: e["loss"])         # min() keeps the earliest on a tie
        assert s["best_step"] == best["step"] == task["best_step"], \
            f"{what}: best_step {s['best_step']} (stdout {task['best_step']}), the minimum " \
            f"heldout loss {best['loss']} is at step {best['step']}"
        assert s["heldout_loss"] == best["loss"] == task["heldout_loss"], \
            f"{what}: heldout_loss {s['heldout_loss']}, minimum {best['loss']}"
        assert s["step"] == last, f"{what}: path event step {s['step']}, expected {last}"
        meta, ts = load(f"{d}/phase-000{t}/paths/path-00{p}.safetensors")
        assert meta["best_step"] == str(best["step"]), f"{what}: metadata best_step {meta}"
        assert meta["step"] == str(last), f"{what}: metadata step {meta['step']}, expected {last}"
        # the published parameters evaluate to the best held-out loss
        ev_ = json.loads(open(f"eval-{t}-{p}.json").read())
        rel = abs(ev_["loss"] - best["loss"]) / best["loss"]
        lastloss = held[-1]["loss"]
        print(f"(2) {what}: best_step {best['step']} of {last}, heldout {best['loss']:.9g} "
              f"(last step {lastloss:.9g}); --eval on the held-out slice {ev_['loss']:.9g} "
              f"over {ev_['tokens']} tokens, rel diff {rel:.2e}")
        assert ev_["tokens"] == 4 * 32, f"{what}: --eval used {ev_['tokens']} tokens, not 128"
        assert rel <= 1e-6, f"{what}: the published parameters do not evaluate to the best loss"
        if best["step"] < last:
            early += 1
            assert best["loss"] < lastloss, f"{what}: best_step < last with no better loss"
        if t == 1:
            # the run evaluating only at the end trained the same: the same moments; the same
            # parameters exactly when the best step is the last
            meta9, ts9 = load(f"{d9}/phase-0001/paths/path-00{p}.safetensors")
            assert meta9["best_step"] == str(last), f"{what}: {d9} best_step {meta9['best_step']}"
            assert meta9["shard_tokens"] == meta["shard_tokens"], f"{what}: shard_tokens differ"
            assert ts.keys() == ts9.keys(), f"{what}: tensor names differ"
            moments = [k for k in ts if k.startswith("optim.")]
            params = [k for k in ts if not k.startswith("optim.")]
            assert moments and params
            bad = [k for k in moments if ts[k] != ts9[k]]
            assert not bad, f"{what}: AdamW moments differ from the last step's: {bad[:3]}"
            same = [k for k in params if ts[k] == ts9[k]]
            if best["step"] == last:
                assert len(same) == len(params), f"{what}: parameters differ from the last step's"
            else:
                assert not same, f"{what}: best_step {best['step']} but the parameters " \
                                 f"{same[:3]} are the last step's"
assert early > 0, "no path stopped early: raise train.lr so that the test tests something"
print(f"(2) early stopping: {early} of 8 path checkpoints publish an earlier step")
EOF
# the held-out tokens are the shard's tail: shard_tokens + held-out = the shard
for p in 0 1 2 3; do
	"$PY" - "$(ckpt E 1 $p)" held-$p.tok E/shards/shard-00$p.tok <<'EOF' || die "shard_tokens"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
held = struct.unpack("<Q", open(sys.argv[2], "rb").read()[24:32])[0]
shard = struct.unpack("<Q", open(sys.argv[3], "rb").read()[24:32])[0]
assert int(meta["shard_tokens"]) + held == shard, (meta["shard_tokens"], held, shard)
EOF
done

# ---- (3) a path checkpoint against the PyTorch reference ----------------------------------
"$PY" -c 'import torch, numpy' 2>/dev/null ||
	skip "skipped: (1) and (2) passed; (3) needs PyTorch: $PY cannot import torch and numpy"
# --eval and the reference print 9 and 17 significant digits: 1e-6 relative is far above
# their rounding (the float32 forward's rounding differences are ~1e-8)
for p in 0 3; do
	expect_ok "$T" --eval "$(ckpt P 2 $p)" -d d/val.tok
	cp out.stdout ours.json
	"$PY" "$ROOT/test/ref/gpt2_torch.py" loss "$(ckpt P 2 $p)" d/val.tok >ref.json ||
		die "gpt2_torch.py loss failed"
	"$PY" - ours.json ref.json "$p" <<'EOF' || die "(3) phase-2 path $p: --eval differs from PyTorch"
import json, sys
o, r = (json.loads(open(f).read()) for f in sys.argv[1:3])
rel = abs(o["loss"] - r["loss"]) / abs(r["loss"])
print(f"(3) phase-2 path {sys.argv[3]}: --eval {o['loss']:.9g} over {o['tokens']} tokens, "
      f"PyTorch {r['loss']:.9g} over {r['tokens']}: rel diff {rel:.2e} (limit 1e-6)")
assert o["tokens"] == r["tokens"], "token counts differ"
sys.exit(0 if rel <= 1e-6 else 1)
EOF
done
echo "ok"
