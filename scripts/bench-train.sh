#!/bin/sh
# bench-train.sh - training speed and memory of dpc-train-path against PyTorch eager.
#
#   scripts/bench-train.sh [-n STEPS] [-c CONFIG] [--tutel DIR] [TOKENS]
#                                  (default 30 steps, configs/gpt-tiny.yaml, data/brown/train.tok)
#
# For 1 and 2 threads: dpc-train-path on CONFIG (gpt-tiny: B=8, T=256) for STEPS steps
# (peak_rss_mb, matmul_frac and its own tokens_per_s from its final JSON; the median of the
# per-step tokens_per_s of its metrics after 3 warm-up steps), then the same model, batch
# and AdamW in PyTorch eager (scripts/bench-train-torch.py: median step time after 3 warm-up
# steps, each setting timed for at most 20 s). At 2 threads PyTorch is measured in its best
# setting of: default (2 intra-op threads), OMP_WAIT_POLICY=PASSIVE, and 1 intra-op thread
# with OPENBLAS_NUM_THREADS=2. Prints one table with the memory bound (params, grads, AdamW
# moments and the activations backward needs, as llm.c stores them, and with flash-style
# attention) and the ratio of our peak RSS to it. A CONFIG with MoE blocks (for example
# configs/gpt-tiny-moe.yaml) is timed against the reference's plain PyTorch MoE
# (test/ref/gpt2_torch.py: the gate, top-k and slots vectorised, each expert's rows gathered,
# multiplied and scattered back with index_add), or with --tutel DIR against Tutel's
# moe_layer in those blocks (DIR: a checkout of microsoft/tutel whose CPU extension
# tutel_custom_kernel is built there, as bench-moe.sh --tutel takes it: `NO_CUDA=1 python3
# setup.py build_ext --inplace` with Debian's libtorch-dev and pybind11-dev; Tutel is not in
# Debian, and nothing of it is in this repository).
# Programs come from $BIN (default build/bin). Runs in about 3 to 5 minutes on 2 cores.
set -eu

usage() { echo "usage: $0 [-n STEPS] [-c CONFIG] [--tutel DIR] [TOKENS]"; }
steps=30 CFG="" tutel=""
while [ $# -gt 0 ]; do
	case $1 in
	-n) [ $# -ge 2 ] || { usage >&2; exit 2; }; steps=$2; shift 2 ;;
	-c) [ $# -ge 2 ] || { usage >&2; exit 2; }
	    case $2 in /*) CFG=$2 ;; *) CFG=$(pwd)/$2 ;; esac; shift 2 ;;
	--tutel) [ $# -ge 2 ] || { usage >&2; exit 2; }; tutel=$2; shift 2 ;;
	--tutel=*) tutel=${1#*=}; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) usage >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -le 1 ] || { usage >&2; exit 2; }
case $steps in '' | *[!0-9]*) echo "$0: -n '$steps': not a number of steps" >&2; exit 2 ;; esac
[ "$steps" -ge 5 ] || { echo "$0: -n $steps: need at least 5 steps" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BIN=${BIN:-$root/build/bin}
PY=/usr/bin/python3
tok=${1:-data/brown/train.tok}
CFG=${CFG:-configs/gpt-tiny.yaml}
[ -f "$CFG" ] || { echo "$0: '$CFG': no such config" >&2; exit 1; }

for p in dpc-train-path dpc-shard; do
	[ -x "$BIN/$p" ] || { echo "$0: '$BIN/$p': not built (run make)" >&2; exit 1; }
done
"$PY" -c 'import torch' 2>/dev/null ||
	{ echo "$0: '$PY': cannot import torch (install python3-torch)" >&2; exit 1; }
tutel_flag=""
if [ -n "$tutel" ]; then
	[ -d "$tutel" ] || { echo "$0: '$tutel': no such directory (--tutel wants a Tutel checkout)" >&2; exit 1; }
	tutel=$(cd "$tutel" && pwd)
	export PYTHONPATH="$tutel${PYTHONPATH:+:$PYTHONPATH}"
	"$PY" -c 'import tutel.moe' >/dev/null 2>&1 ||
		{ echo "$0: '$tutel': cannot import tutel from it with $PY (is tutel_custom_kernel built?)" >&2; exit 1; }
	tutel_flag=--tutel
fi

# The corpus, as the quickstart makes it, when the default token file is missing.
if [ ! -f "$tok" ]; then
	[ "$tok" = data/brown/train.tok ] || { echo "$0: '$tok': no such file" >&2; exit 1; }
	echo "==> preparing data/brown (scripts/get-brown.sh, dpc-shard prepare)" >&2
	sh scripts/get-brown.sh data/brown >&2
	"$BIN/dpc-shard" prepare --force data/brown/brown.jsonl data/brown >&2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-train.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

ours=""
for t in 1 2; do
	echo "==> dpc-train-path, $t thread(s), $steps steps ($(date +%T))" >&2
	OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$BIN/dpc-train-path" -c "$CFG" -d "$tok" \
		-o "$tmp/ours-$t.safetensors" -m "$tmp/ours-$t.jsonl" -u "$steps" -t "$t" -q \
		>"$tmp/ours-$t.json"
	ours="$ours --ours $t=$tmp/ours-$t.json --ours-metrics $t=$tmp/ours-$t.jsonl"
done

echo "==> PyTorch eager (threads 1, 2; settings at 2: default, passive, blas) ($(date +%T))" >&2
# shellcheck disable=SC2086
"$PY" scripts/bench-train-torch.py -c "$CFG" -d "$tok" -n "$steps" --threads 1,2 $ours \
	$tutel_flag
