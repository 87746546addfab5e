#!/bin/sh
# moe-brown.sh - the MoE GPT against the dense GPT on Brown, at equal steps: does routing the
# MLPs through experts buy a lower loss for the same work per token?
#
#   sh scripts/moe-brown.sh [-n STEPS] [-t THREADS] [-o DIR] [DATADIR]
#                                        (default 1000 steps, all cores, runs/moe-brown,
#                                         data/brown-1k: scripts/brown-1k.sh makes it)
#
# Three runs of configs/gpt-tiny.yaml's schedule, shortened to STEPS, same seed, same batches
# (B = 8 windows of 256 bytes), each evaluated every STEPS/10 steps on the validation split
# and at the end on all of it:
#   dense      gpt-tiny (4 blocks of width 256, MLPs of 4C)
#   moe-top1   the MLPs of blocks 1 and 3 as 8 experts of 4C, each token to its top 1: the
#              dense model's active parameters and flops per token (the gate aside), 8 times
#              its parameters in those blocks (Switch's routing)
#   moe-top2   configs/gpt-tiny-moe.yaml: the same experts, each token to its top 2 (twice
#              the dense MLP's work in those blocks)
# Prints one table (parameters, active parameters per token, tokens/s, the final validation
# loss and its difference from dense) and writes DIR/summary.json, DIR/<run>.jsonl (the
# metrics, with the MoE blocks' capacity events) and DIR/curves.png (scripts/plot.sh).
# Resumable: a run whose checkpoint is there is not trained again.
set -eu

steps=1000 threads="" out=runs/moe-brown
while [ $# -gt 0 ]; do
	case $1 in
	-n) [ $# -ge 2 ] || { echo "moe-brown.sh: -n needs a number" >&2; exit 2; }; steps=$2; shift 2 ;;
	-t) [ $# -ge 2 ] || { echo "moe-brown.sh: -t needs a number" >&2; exit 2; }; threads=$2; shift 2 ;;
	-o) [ $# -ge 2 ] || { echo "moe-brown.sh: -o needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	-*) echo "moe-brown.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
case $steps in '' | *[!0-9]* | 0*) echo "moe-brown.sh: -n wants a positive integer, not '$steps'" >&2; exit 2 ;; esac
[ "$steps" -ge 10 ] || { echo "moe-brown.sh: -n $steps: at least 10 steps" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
data=${1:-$root/data/brown-1k}
bin=${BIN:-$root/build/bin}
[ -x "$bin/dpc-train-path" ] || { echo "moe-brown.sh: '$bin/dpc-train-path': not built (run make)" >&2; exit 1; }
for f in train.tok val.tok; do
	[ -s "$data/$f" ] || { echo "moe-brown.sh: '$data/$f': missing (sh scripts/brown-1k.sh makes it)" >&2; exit 1; }
done
mkdir -p "$out"
every=$((steps / 10))
tflag=${threads:+-t $threads}

run() { # run NAME CONFIG OVERRIDES...
	name=$1 cfg=$2
	shift 2
	if [ -s "$out/$name.safetensors" ] && [ -s "$out/$name.json" ]; then
		echo "moe-brown.sh: $name: done before, kept" >&2
		return 0
	fi
	echo "moe-brown.sh: $name: $steps steps ($(date +%T))" >&2
	sets=""
	for s in "$@"; do sets="$sets -s $s"; done
	rm -f "$out/$name.jsonl"
	# shellcheck disable=SC2086
	"$bin/dpc-train-path" -c "$cfg" -s train.steps="$steps" -s train.warmup_steps=$((steps / 20)) \
		-s train.eval_every=$every -s train.checkpoint_every=0 $sets -d "$data/train.tok" \
		-v "$data/val.tok" -o "$out/$name.safetensors.tmp" -m "$out/$name.jsonl" $tflag -q \
		-f >"$out/$name.train.json"
	"$bin/dpc-train-path" --eval "$out/$name.safetensors.tmp" -d "$data/val.tok" >"$out/$name.eval.json"
	python3 - "$out/$name.train.json" "$out/$name.eval.json" >"$out/$name.json" <<'EOF'
import json, sys
t = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
e = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print(json.dumps({"train": t, "eval": e}))
EOF
	mv "$out/$name.safetensors.tmp" "$out/$name.safetensors"
}

run dense "$root/configs/gpt-tiny.yaml"
run moe-top1 "$root/configs/gpt-tiny-moe.yaml" moe.top_k=1
run moe-top2 "$root/configs/gpt-tiny-moe.yaml"

sh "$root/scripts/plot.sh" -o "$out/curves.png" --title "Brown, $steps steps: dense against MoE" \
	"$out/dense.jsonl" "$out/moe-top1.jsonl" "$out/moe-top2.jsonl" >/dev/null
python3 - "$out" "$bin" <<'EOF'
import json, os, subprocess, sys
out, bin = sys.argv[1], sys.argv[2]
rows = {}
for name in ("dense", "moe-top1", "moe-top2"):
    r = json.load(open(os.path.join(out, name + ".json")))
    info = json.loads(subprocess.run([os.path.join(bin, "dpc-train-path"), "--info",
                                      os.path.join(out, name + ".safetensors")],
                                     capture_output=True, text=True, check=True).stdout)
    total = info["params"]
    mo = info["model"].get("moe")
    active = total
    if mo:  # a token uses top_k of the experts' parameters in each MoE block
        per_expert = sum(t["numel"] for t in info["tensors"]
                         if ".moe.fc" in t["name"] and not t["name"].startswith("optim.")) \
            / mo["experts"]
        active = total - per_expert * (mo["experts"] - mo["top_k"])
    rows[name] = {"params": total, "active_params": int(active),
                  "tokens_per_s": r["train"]["tokens_per_s"], "val_loss": r["eval"]["loss"],
                  "val_tokens": r["eval"]["tokens"], "gemm_kernel": r["train"].get("gemm_kernel")}
d = rows["dense"]["val_loss"]
print(f"{'run':10s} {'params':>10s} {'active/token':>13s} {'tok/s':>8s} {'val loss':>9s} {'- dense':>8s}")
for n, r in rows.items():
    print(f"{n:10s} {r['params']:>10,d} {r['active_params']:>13,d} {r['tokens_per_s']:>8.0f} "
          f"{r['val_loss']:>9.4f} {r['val_loss'] - d:>+8.4f}")
print(f"validation: {rows['dense']['val_tokens']} tokens; curves: {out}/curves.png")
tmp = os.path.join(out, "summary.json.tmp")
with open(tmp, "w") as f:
    json.dump(rows, f, indent=1)
os.replace(tmp, os.path.join(out, "summary.json"))
EOF
