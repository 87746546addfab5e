# t-dipaco-sample.sh - path sampling (dipaco.paths_per_phase, DiPaCo section 2.6.2): P = 8
# paths (levels of 4 x 2 modules), N = 4 trained per phase, 3 phases.
#   - the key's refusals (0, more than P): one line naming the config file and the key, exit 2;
#   - the run under make -j2, then killed with SIGKILL mid-phase (after --until 1) and rerun:
#     every checkpoint bit-identical to the uninterrupted run's; under mpirun --mpi 2 too;
#   - an independent reader (numpy, struct, json; safetensors read by test/ref's own reader,
#     not by our C code) checks the record
#     against the documented draw and its guarantee (every window of ceil(P/N) phases trains
#     every path), that only sampled paths have checkpoints, that every module no sampled path
#     used is unchanged (parameters and outer momentum, byte for byte) while every other one
#     changed, and every changed module against the outer step recomputed in float64 from the
#     sampled paths (token weights renormalised over them, sqrt of their count);
#   - with PyTorch: a path that sat a phase out (and one that never trained before) starts
#     from its own latest checkpoint's AdamW moments: its first two steps' losses against
#     test/ref/gpt2_torch.py steps from those moments, and the same from wrong ones (zero
#     moments, bias correction counting the global step) shown to differ;
#   - dpc-outer metrics' table, dpc-route's run path set and early stopping on the run.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
ROOT=$(cd "$TESTDIR/../.." && pwd)
PY=/usr/bin/python3
for p in dpc-outer dpc-shard dpc-train-path dpc-route; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
export OMP_NUM_THREADS=1

# the model of configs/gpt-small-test.yaml (L=2 C=32 NH=2 T=32 V=256), our own schedule
sed -n '/^model:/,/^  vocab_size:/p' "$ROOT/configs/gpt-small-test.yaml" >s8.yaml
cat >>s8.yaml <<'EOF'
train:
  batch_size: 2
  steps: 90
  lr: 1.0e-2
  warmup_steps: 2
  eval_every: 0
  eval_batches: 1
  checkpoint_every: 0
  seed: 5
dipaco:
  phases: 3
  inner_steps: 30
  paths_per_phase: 4
  holdout: true
  holdout_frac: 0.1
levels:
  - name: lower
    owns: embed h.0
    modules: 4
  - name: upper
    owns: h.1 head
    modules: 2
EOF

make_corpus c.jsonl 80
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d

# ---- refusals: N < 1 and N > P, in the file and as an override ----------------------------
sed 's/paths_per_phase: 4/paths_per_phase: 9/' s8.yaml >nine.yaml
expect_fail 2 "^dpc-outer: 'nine\.yaml': dipaco\.paths_per_phase \(9\) is more than the 8 paths of the run$" \
	"$BIN/dpc-outer" init -c nine.yaml bad
sed 's/paths_per_phase: 4/paths_per_phase: 0/' s8.yaml >zero.yaml
line=$(grep -n paths_per_phase zero.yaml | cut -d: -f1)
expect_fail 2 "^dpc-outer: 'zero\.yaml': line $line: dipaco\.paths_per_phase: 0 is outside \[1, 65536\]$" \
	"$BIN/dpc-outer" init -c zero.yaml bad
expect_fail 2 "^dpc-outer: override 'dipaco\.paths_per_phase=0': dipaco\.paths_per_phase: 0 is outside \[1, 65536\]$" \
	"$BIN/dpc-outer" init -c s8.yaml -s dipaco.paths_per_phase=0 bad
[ ! -e bad ] || die "a refused config made a run directory"
echo "dipaco.paths_per_phase 0 and 9 of 8 paths: refused in one line naming the file (or the override) and the key, exit 2"

train() {
	sh "$ROOT/scripts/dipaco-train.sh" --bin "$BIN" "$@" d/train.tok d/val.tok
}
ckpts() { (cd "$1" && find . -name '*.safetensors' | sort); }
same_run() {
	ckpts mk >a.list
	ckpts "$1" >b.list
	cmp -s a.list b.list || { diff a.list b.list | head; die "$1 has other checkpoints than mk"; }
	while read -r f; do same_file "mk/$f" "$1/$f"; done <a.list
	same_file mk/sampled.json "$1/sampled.json"
}

# ---- the reference run under make ------------------------------------------------------------
train -j 2 s8.yaml mk >mk.out 2>&1 || { cat mk.out; die "the make run failed"; }
# progress counts the tasks of the graph: 3 phases x (4 sampled paths + 6 modules)
grep -q "30/30 tasks done" mk.out || { cat mk.out; die "progress: expected 30/30 tasks"; }
grep -Eq '^ +3 +4/4 ' mk.out || { cat mk.out; die "the metrics table has no line '3 4/4'"; }
echo "make -j2: 30 tasks, the table counts 4 of the 4 paths each phase trains"

# ---- --until 1, then killed with SIGKILL in the middle of phase 2, then the same command ------
train -q -j 2 --until 1 s8.yaml k >k1.out 2>&1 || { cat k1.out; die "--until 1 failed"; }
[ -z "$(ls k/phase-0002/paths 2>/dev/null)" ] || die "--until 1 trained phase 2"
ls k/phase-0001/modules/*.safetensors | wc -l | grep -qx 6 || die "--until 1: not 6 modules"
# The rerun's programs: ours, but a phase-2 path task is stopped (SIGSTOP) as soon as a phase-2
# metrics file is being written, and says so in phase2.stopped: the kill then lands in the
# middle of phase 2 however fast the machine (polling for the short-lived .part from here
# missed every phase-2 task on a fast one).
mkdir wrap
for p in "$BIN"/*; do ln -s "$p" wrap/; done
rm wrap/dpc-train-path
cat >wrap/dpc-train-path <<EOF
#!/bin/sh
case " \$* " in *" --phase 2 "*) ;; *) exec "$BIN/dpc-train-path" "\$@" ;; esac
"$BIN/dpc-train-path" "\$@" & c=\$!
while kill -0 \$c 2>/dev/null; do
	for f in phase-0002/paths/*.jsonl.part; do
		[ -e "\$f" ] && { kill -STOP \$c; touch "$SCRATCH/phase2.stopped"; wait \$c; exit 1; }
	done
done
wait \$c
EOF
chmod +x wrap/dpc-train-path
setsid sh "$ROOT/scripts/dipaco-train.sh" --bin wrap -q -j 2 s8.yaml k d/train.tok \
	d/val.tok >k2.out 2>&1 &
pid=$!
i=0
while [ $i -lt 1200 ] && [ ! -e "$SCRATCH/phase2.stopped" ] && kill -0 "$pid" 2>/dev/null; do
	sleep 0.1; i=$((i + 1))
done
[ -e "$SCRATCH/phase2.stopped" ] || { cat k2.out; die "no phase-2 task seen running"; }
ls k/phase-0002/paths/*.jsonl.part >/dev/null 2>&1 || die "phase 2 stopped, yet no task was writing"
kill -KILL "-$pid" 2>/dev/null || die "the run ended before it could be killed"
wait "$pid" 2>/dev/null || true
[ ! -e k/phase-0003/modules/upper.1.safetensors ] || die "the killed run had finished"
train -q -j 2 s8.yaml k >k3.out 2>&1 || { cat k3.out; die "the rerun failed"; }
same_run k
leftover=$(find k -name '*.tmp.*' -o -name '*.part' | head -3)
[ -z "$leftover" ] || die "the resumed run left temporary files: $leftover"
echo "--until 1, killed mid-phase 2 with SIGKILL, rerun: every checkpoint bit-identical"

# ---- under mpirun ------------------------------------------------------------------------
if command -v mpirun >/dev/null 2>&1; then
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
	export MPIRUN_ARGS="--oversubscribe"
	train -q --mpi 2 s8.yaml mp >mp.out 2>&1 || { cat mp.out; die "the mpirun run failed"; }
	same_run mp
	echo "mpirun --mpi 2: every checkpoint bit-identical to make's"
else
	echo "skipped: the mpirun part (no mpirun; apt-get install openmpi-bin)"
fi

# ---- the independent reader (Python, numpy) ---------------------------------------------------
"$PY" - mk "$ROOT/test/ref" <<'EOF' || die "the reader's checks failed"
import json, math, os, struct, sys
import numpy as np

run, refdir = sys.argv[1], sys.argv[2]
sys.path.insert(0, refdir)
# test/ref's own readers (numpy, struct, json, zlib; written from the formats' pages, not
# from our C code): Philox4x32-10 of rng.h, checked there against Random123's known answers,
# and safetensors with every crc32 checked
from gpt2_torch import rng_below, st_read as st

def config(path):
    flat, sec = {}, None
    for line in open(path):
        if line.startswith("levels:"):
            break
        if not line.startswith(" "):
            sec = line.strip().rstrip(":")
        elif ":" in line:
            k, v = line.strip().split(":", 1)
            flat[f"{sec}.{k}"] = v.strip()
    return flat

cfg = config(f"{run}/config.yaml")
P, N, T = 8, int(cfg["dipaco.paths_per_phase"]), int(cfg["dipaco.phases"])
seed = int(cfg["train.seed"])
E = -(-P // N)
fail = []

# the record: the documented draw from the seed, and its guarantee
rec = json.load(open(f"{run}/sampled.json"))
pi = list(range(P))
for i in range(P - 1, 0, -1):
    j = rng_below(seed, 11, i, i + 1)
    pi[i], pi[j] = pi[j], pi[i]
want = [sorted(pi[((t - 1) * N + i) % P] for i in range(N)) for t in range(1, T + 1)]
if (rec["paths"], rec["paths_per_phase"], rec["seed"]) != (P, N, seed):
    fail.append(f"record header {rec['paths']}, {rec['paths_per_phase']}, {rec['seed']}")
if rec["order"] != pi or rec["phases"] != want:
    fail.append(f"record {rec['order']} {rec['phases']} is not the draw {pi} {want}")
for t in range(T):
    if len(set(rec["phases"][t])) != N or not all(0 <= p < P for p in rec["phases"][t]):
        fail.append(f"phase {t + 1}: {rec['phases'][t]}")
for a in range(T - E + 1):
    seen = set().union(*rec["phases"][a:a + E])
    if seen != set(range(P)):
        fail.append(f"phases {a + 1}..{a + E} miss {set(range(P)) - seen}")
sampled = [set(x) for x in rec["phases"]]

# only sampled paths have checkpoints (and metrics)
for t in range(1, T + 1):
    d = f"{run}/phase-{t:04d}/paths"
    have = {int(f[5:8]) for f in os.listdir(d) if f.endswith(".safetensors")}
    if have != sampled[t - 1]:
        fail.append(f"phase {t}: checkpoints of paths {sorted(have)}, drawn {sorted(sampled[t - 1])}")

# modules: users from the topology (path p = lower index * 2 + upper index, the last level
# fastest), cross-checked with the module files' own metadata
users = {f"lower.{e}": {2 * e, 2 * e + 1} for e in range(4)}
users.update({f"upper.{e}": {p for p in range(P) if p % 2 == e} for e in range(2)})
man = json.load(open(f"{run}/shards/shards.json"))
ntok = [s["tokens"] for s in man["shards"]]
lr, mu = float(cfg["dipaco.outer_lr"]), float(cfg["dipaco.outer_momentum"])
MOM = "outer.momentum."
kept = moved = wrong_weights_seen = 0
for t in range(1, T + 1):
    for m, us in users.items():
        prev, _ = st(f"{run}/phase-{t - 1:04d}/modules/{m}.safetensors")
        cur, meta = st(f"{run}/phase-{t:04d}/modules/{m}.safetensors")
        if {int(x) for x in meta["paths"].split(",")} != us or meta["phase"] != str(t):
            fail.append(f"{m} phase {t}: metadata paths {meta['paths']} phase {meta['phase']}")
        if sorted(prev) != sorted(cur):
            fail.append(f"{m} phase {t}: other tensors than phase {t - 1}")
            continue
        used = sorted(us & sampled[t - 1])
        diag = json.loads(open(f"{run}/phase-{t:04d}/modules/{m}.json").read())
        if diag["paths"] != used:
            fail.append(f"{m} phase {t}: diagnostics fold {diag['paths']}, drawn {used}")
        if not used:
            kept += 1
            for k in cur:
                if cur[k].tobytes() != prev[k].tobytes():
                    fail.append(f"{m} phase {t}: no sampled path uses it, yet '{k}' changed")
            continue
        moved += 1
        thetas = [st(f"{run}/phase-{t:04d}/paths/path-{p:03d}.safetensors")[0] for p in used]
        a = np.array([ntok[p] for p in used], dtype=np.float64)
        a /= a.sum()
        a_all = np.array([ntok[p] for p in used], dtype=np.float64) / sum(ntok[p] for p in us)
        s = math.sqrt(len(used))
        for k in (k for k in cur if not k.startswith(MOM)):
            p0 = prev[k].astype(np.float64)
            b0 = prev[MOM + k].astype(np.float64)
            def step(w):
                g = s * sum(wi * (p0 - th[k].astype(np.float64)) for wi, th in zip(w, thetas))
                b = mu * b0 + g
                return p0 - lr * (g + mu * b), b
            want_p, want_b = step(a)
            for name, got, ref in ((k, cur[k], want_p), (MOM + k, cur[MOM + k], want_b)):
                err = np.abs(got - ref) - (1e-6 + 1e-5 * np.abs(ref))
                if err.max() > 0:
                    fail.append(f"{m} phase {t} '{name}': off the outer step by {err.max():.3g}")
            if np.array_equal(cur[k], prev[k]) or np.array_equal(cur[MOM + k], prev[MOM + k]):
                fail.append(f"{m} phase {t} '{k}': a sampled path uses it, yet it did not move")
            # weights not renormalised over the sampled paths: this check would see it
            if len(used) < len(us):
                wp, _ = step(a_all)
                if np.abs(wp - cur[k]).max() > 1e-4:
                    wrong_weights_seen += 1
if kept == 0 or moved == 0:
    fail.append(f"{kept} modules kept and {moved} moved: the run does not test both")
if wrong_weights_seen == 0:
    fail.append("weights left unrenormalised would not have been noticed")
for f in fail:
    print("FAILED:", f)
print(f"reader: record = the draw from seed {seed} ({pi}), windows of {E} phases cover all "
      f"paths; {kept} module steps kept every byte of parameters and momentum; {moved} match "
      f"the outer step of their sampled paths (weights renormalised)")
sys.exit(1 if fail else 0)
EOF

# ---- a path back from a phase it sat out: its own moments ------------------------------------
# Path a trained in phase 1, sat phase 2 out and trains phase 3 from phase 2's modules and its
# phase-1 checkpoint's AdamW moments (bias correction counting the tau steps they took); path b
# first trains in phase 2, from zero moments. The reference (test/ref/gpt2_torch.py) takes two
# steps from those states with the batches and learning rates of the phase's first two global
# steps; the trainer's first two losses (its metrics) must agree within 1e-5 relative (the
# second one depends on the moments through the first update), and the same two steps from
# wrong states (zero moments for a; bias correction counting the global step) must not.
if "$PY" -c 'import torch, numpy' 2>/dev/null; then
	"$PY" - mk "$ROOT/test/ref" <<'EOF' || die "a path back from a sat-out phase did not start from its own moments"
import json, os, subprocess, sys
import numpy as np

run, refdir = sys.argv[1], sys.argv[2]
sys.path.insert(0, refdir)
from gpt2_torch import st_read, write_ckpt, read_tokens, param_shapes
REF = os.path.join(refdir, "gpt2_torch.py")
rec = json.load(open(f"{run}/sampled.json"))
ph = [set(x) for x in rec["phases"]]
tau = 30
m = {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 32, "vocab_size": 256}
names = [n for n, _ in param_shapes(m)]

def ref_two_steps(P, M, V, step, at, toks, tag):
    """Two reference steps from (P, M, V) whose moments took `step` steps; the losses."""
    write_ckpt(f"{tag}.in.st", P, M, V, step, m)
    losses = []
    src = f"{tag}.in.st"
    for i in range(2):
        out = subprocess.run([sys.executable, REF, "step", src, toks, "-c", f"{run}/config.yaml",
                              "--at", str(at + i), f"{tag}.{i}.st"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"gpt2_torch.py step: {out.stderr}")
        losses.append(json.loads(out.stdout)["loss"])
        src = f"{tag}.{i}.st"
    return losses

def case(p, t, own):
    # parameters: path p's modules after phase t-1, read from the module files
    P = {}
    for mod in (f"lower.{p // 2}", f"upper.{p % 2}"):
        t_, _ = st_read(f"{run}/phase-{t - 1:04d}/modules/{mod}.safetensors")
        P.update({k: v for k, v in t_.items() if not k.startswith("outer.")})
    assert sorted(P) == sorted(names), sorted(P)
    zero = {n: np.zeros_like(P[n]) for n in names}
    if own:
        c, meta = st_read(f"{run}/phase-{own:04d}/paths/path-{p:03d}.safetensors")
        M = {n: c[f"optim.exp_avg.{n}"] for n in names}
        V = {n: c[f"optim.exp_avg_sq.{n}"] for n in names}
    else:
        M, V = zero, zero
    # the training part of the shard (the held-out tail cut off), as the trainer reads it
    c, meta = st_read(f"{run}/phase-{t:04d}/paths/path-{p:03d}.safetensors")
    toks = read_tokens(f"{run}/shards/shard-{p:03d}.tok")[:int(meta["shard_tokens"])]
    np.save(f"tok{p}.npy", toks)
    ours = {}
    for line in open(f"{run}/phase-{t:04d}/paths/path-{p:03d}.jsonl"):
        e = json.loads(line)
        if e["event"] == "train":
            ours[e["step"]] = e["loss"]
    got = [ours[(t - 1) * tau + 1], ours[(t - 1) * tau + 2]]
    at = (t - 1) * tau
    right = ref_two_steps(P, M, V, own * tau, at, f"tok{p}.npy", f"r{p}")
    wrong = {"bias correction counting the global step": ref_two_steps(P, M, V, at, at,
                                                                        f"tok{p}.npy", f"w{p}")}
    if own:
        wrong["zero moments"] = ref_two_steps(P, zero, zero, 0, at, f"tok{p}.npy", f"z{p}")
    ok = all(abs(g - r) <= 1e-5 * abs(r) for g, r in zip(got, right))
    print(f"path {p} phase {t} (own checkpoint of phase {own}): losses {got}, reference {right}")
    for what, w in wrong.items():
        gap = abs(w[1] - got[1]) / abs(w[1])
        print(f"  from {what}: {w}, second loss off by {gap:.2g}")
        if gap < 1e-4:
            ok = False
            print("FAILED: the trainer's second loss is that of this wrong start too (or "
                  "the check cannot tell the two apart)")
    return ok

a = next(p for p in range(8) if p in ph[0] and p not in ph[1] and p in ph[2])
b = next(p for p in range(8) if p not in ph[0] and p in ph[1])
sys.exit(0 if case(a, 3, 1) & case(b, 2, 0) else 1)
EOF
	echo "paths back from a sat-out phase (or new): their first steps as from their own moments"
else
	echo "skipped: the moments check (no PyTorch in $PY)"
fi

# ---- readers of the run: dpc-route's path set (all 8 paths, assembled from the modules) and
# early stopping (each path at its best phase, on its shard's held-out tail) ------------------
base=mk/phase-0003/paths/$(ls mk/phase-0003/paths | grep -m1 safetensors)
expect_ok "$BIN/dpc-route" features -q --prefix 8 -m "$base" -o F.st d/train.tok
expect_ok "$BIN/dpc-route" kmeans -q -k 8 -o K.st F.st
expect_ok "$BIN/dpc-route" eval --early-stop --run mk -m "$base" --router K.st d/val.tok
n=$(grep -c '^dpc-route: early stopping: path [0-7] at phase [1-3] ' out.stderr || true)
[ "$n" = 8 ] || { cat out.stderr; die "early stopping reported $n paths, expected 8"; }
grep -q '^once per document ' out.stdout || { cat out.stdout; die "no evaluation table"; }
echo "dpc-route eval --early-stop --run: the 8 paths, each at its best phase"

# ---- the record and its readers: a path the draw did not pick is refused; a record that is
# not the config's draw is an error naming it, for every reader; the Slurm plan follows it ---
notp=$(python3 -c "import json; print(min(set(range(8)) - set(json.load(open('mk/sampled.json'))['phases'][0])))")
expect_fail 2 "^dpc-train-path: '.*mk/sampled\.json': phase 1 does not train path $notp \(it trains 4 of the 8 paths, dipaco\.paths_per_phase\)$" \
	"$BIN/dpc-train-path" -q --run mk --phase 1 --path "$notp"
cp -r mk bad
sed 's/"seed": 5/"seed": 6/' mk/sampled.json >bad/sampled.json
for cmd in "dpc-outer tasks bad" "dpc-outer makefile bad" "dpc-outer metrics bad" \
	"dpc-outer step bad --phase 1" "dpc-train-path --run bad --phase 1 --path 0" \
	"dpc-route score -q --run bad -o S.st d/val.tok"; do
	# shellcheck disable=SC2086
	expect_fail 2 "^dpc-[a-z-]+: 'bad/sampled\.json': is not the config's draw of paths \(dipaco\.paths_per_phase 4 of 8 paths, train\.seed 5, 3 phases\); it belongs to another config$" \
		"$BIN"/$cmd
done
rm -rf bad
echo "a path outside the draw refused; a record not the config's draw refused by every reader"
expect_ok "$BIN/dpc-outer" init -c s8.yaml sl
expect_ok "$BIN/dpc-shard" split -q --random 8 d/train.tok sl/shards
sh "$ROOT/scripts/dipaco-slurm.sh" --bin "$BIN" --dry-run sl >slurm.out 2>&1 ||
	{ cat slurm.out; die "dipaco-slurm.sh --dry-run failed"; }
"$PY" - sl/sampled.json slurm.out <<'EOF' || die "the Slurm jobs are not the draw's tasks"
import json, re, sys
rec = json.load(open(sys.argv[1]))["phases"]
trains = {(int(t), int(p)) for t, p in re.findall(r"^JOB[0-9_]+\ttrain (\d+) (\d+)", open(sys.argv[2]).read(), re.M)}
want = {(t + 1, p) for t, ps in enumerate(rec) for p in ps}
if trains != want:
    sys.exit(f"FAILED: Slurm train jobs {sorted(trains)}, drawn {sorted(want)}")
EOF
echo "dipaco-slurm.sh --dry-run: one train job for each drawn (phase, path), no other"
