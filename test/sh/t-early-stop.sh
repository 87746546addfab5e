# t-early-stop.sh - early stopping as the DiPaCo paper does it (section 2.7): dpc-route eval
# --early-stop takes each path at the phase whose parameters have the lowest loss on the
# path's own validation set (the held-out tail of its shard), against the independent
# PyTorch reference (test/ref/gpt2_torch.py loss).
#
# The run: two paths that share nothing (a level of 2 modules), 3 phases of 6 steps, a high
# learning rate, holding out the last 20% of each shard (dipaco.holdout, without the
# within-phase variant, so that every checkpoint holds its phase's last step). With an
# outer step of lr 1, momentum 0 and no rescaling, a module of one path after phase t is that
# path's checkpoint of phase t bit for bit (test_outer), so the reference scores the path
# checkpoints: the tail tokens of each shard cut here in numpy, the loss of every phase's
# checkpoint over the same windows; the phases chosen must be the reference's argmins and the
# losses within 1e-4 relative (the report prints 4 decimals), and each training task's own
# heldout_loss (its metrics) within 1e-5 of the reference's. Path 1's phase-3 parameters are
# made worse (module and checkpoint alike), so its choice is an earlier phase. Then the refusals: without held-out data, and with --path.
# Skips (77) without PyTorch in /usr/bin/python3 or without the programs.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
REF="$ROOT/test/ref/gpt2_torch.py"
need_torch
for p in dpc-route dpc-shard dpc-train-path dpc-outer; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
export OMP_NUM_THREADS=1

make_corpus c.jsonl 80
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0.1 c.jsonl d
sed -n '/^model:/,/^  seed:/p' "$ROOT/configs/gpt-small-test.yaml" >es.yaml
cat >>es.yaml <<'EOF'
dipaco:
  phases: 3
  inner_steps: 6
  outer_lr: 1.0
  outer_momentum: 0.0
  rescale: false
  holdout: true
  holdout_frac: 0.2
levels:
  - name: all
    owns: embed h.0-1 head
    modules: 2
EOF
sets="-s train.steps=18 -s train.lr=2e-2 -s train.warmup_steps=2 -s train.eval_every=0"
# shellcheck disable=SC2086
expect_ok "$BIN/dpc-train-path" -q -c "$ROOT/configs/gpt-small-test.yaml" $sets \
	-d d/train.tok -o base.st
expect_ok "$BIN/dpc-route" features -q --prefix 8 -m base.st -o F.st d/train.tok
expect_ok "$BIN/dpc-route" kmeans -q -k 2 -o K.st F.st
mkdir R
expect_ok "$BIN/dpc-shard" split -q --router K.st --features F.st d/train.tok R/shards
# shellcheck disable=SC2086
expect_ok sh "$ROOT/scripts/dipaco-train.sh" -q -j 2 $sets es.yaml R d/train.tok
# Path 1's parameters after phase 3 made worse, in its module (what eval reads) and in its
# checkpoint (what the reference reads) alike: its lm_head times 3, so an earlier phase wins.
for f in R/phase-0003/modules/all.1.safetensors R/phase-0003/paths/path-001.safetensors; do
	"$PY" "$TESTDIR/stedit.py" "$f" "$f.new" scale lm_head.weight 3 && mv "$f.new" "$f"
done
expect_ok "$BIN/dpc-route" eval --early-stop --run R -m base.st --router K.st \
	--json E.json d/val.tok
grep '^dpc-route: early stopping' out.stderr >chosen.txt || die "no early-stopping report: $(cat out.stderr)"
cat chosen.txt

# the reference: each path's held-out tail, and every phase's checkpoint scored on it
"$PY" - "$REF" <<'EOF' || die "the reference disagrees (above)"
import json, re, subprocess, sys, zlib, struct
import numpy as np
ref = sys.argv[1]
def tokens(path):
    raw = open(path, "rb").read()
    _, _, nd, nt, width, crc, mb = struct.unpack_from("<IIQQIIQ", raw, 8)
    return np.frombuffer(raw, {2: "<u2", 4: "<u4"}[width], nt, 64).astype(np.int64)
got = {}
for line in open("chosen.txt"):
    m = re.match(r"dpc-route: early stopping: path (\d+) at phase (\d+) \(held-out loss ((?:[0-9.]+ )+)after phases 1\.\.3\)", line)
    if not m:
        print("FAILED: cannot read '%s'" % line.strip()); sys.exit(1)
    got[int(m.group(1))] = (int(m.group(2)), [float(x) for x in m.group(3).split()])
if sorted(got) != [0, 1]:
    print("FAILED: paths reported %s" % sorted(got)); sys.exit(1)
B, T, batches = 4, 32, 2
for p in (0, 1):
    t = tokens("R/shards/shard-%03d.tok" % p)
    nheld = int(len(t) * 0.2)
    np.save("tail%d.npy" % p, t[len(t) - nheld:])
    want = []
    for ph in (1, 2, 3):
        out = subprocess.run(["/usr/bin/python3", ref, "loss",
                              "R/phase-%04d/paths/path-%03d.safetensors" % (ph, p), "tail%d.npy" % p,
                              "--max-tokens", str(batches * B * T)], capture_output=True, text=True)
        if out.returncode:
            print("FAILED: " + out.stderr); sys.exit(1)
        want.append(json.loads(out.stdout)["loss"])
        tm = [json.loads(l) for l in open("R/phase-%04d/paths/path-%03d.jsonl" % (ph, p))
              if '"event":"path"' in l.replace(" ", "")]
        if not tm or tm[-1]["best_step"] != tm[-1]["step"]:
            print("FAILED: phase %d path %d: no path event, or parameters of step %s, not of "
                  "the last step" % (ph, p, tm[-1].get("best_step") if tm else None))
            sys.exit(1)
        if ph < 3 and abs(tm[-1]["heldout_loss"] - want[-1]) > 1e-5 * want[-1]:
            print("FAILED: phase %d path %d: training's heldout_loss %r, the reference's %r"
                  % (ph, p, tm[-1]["heldout_loss"], want[-1]))
            sys.exit(1)
    best = 1 + min(range(3), key=lambda i: want[i])
    phase, losses = got[p]
    rel = max(abs(a - b) / b for a, b in zip(losses, want))
    print("path %d: ours %s, reference %s: phase %d, relative difference %.1e" % (
        p, losses, ["%.4f" % x for x in want], best, rel))
    if phase != best or rel > 1e-4:
        print("FAILED: path %d: phase %d, the reference's %d" % (p, phase, best)); sys.exit(1)
if got[1][0] == 3:
    print("FAILED: path 1 kept the phase-3 parameters made worse"); sys.exit(1)
src = json.load(open("E.json"))["source"]
want_src = "run R early-stopped by phase 3 at phases %d,%d" % (got[0][0], got[1][0])
if src != want_src:
    print("FAILED: source '%s', expected '%s'" % (src, want_src)); sys.exit(1)
EOF

# no held-out data: refused in one line; --early-stop with --path: a usage error
# shellcheck disable=SC2086
expect_ok sh "$ROOT/scripts/dipaco-train.sh" -q -j 2 $sets -s dipaco.holdout=false es.yaml N d/train.tok
expect_fail 2 "^dpc-route: 'N': holds no validation set out of its shards \(dipaco\.holdout is false and dipaco\.early_stop_every 0\): there is nothing to stop early on$" \
	"$BIN/dpc-route" eval -q --early-stop --run N -m base.st --router K.st d/val.tok
expect_fail 2 "^dpc-route: eval: --early-stop picks phases of a run: it goes with --run, not with --path$" \
	"$BIN/dpc-route" eval -q --early-stop --path base.st -m base.st d/val.tok
echo "early stopping: each path at the phase of its lowest held-out loss, as the PyTorch reference finds"
