#!/bin/sh
# Quickstart: install what is needed, build, fetch the Brown corpus, prepare it, train the
# gpt-tiny model on the CPU and print its validation loss. Idempotent and resumable: run it
# again and every stage whose output exists is skipped (training resumes from its checkpoint).
#   sh scripts/quickstart.sh [STEPS]      (default 1000 steps, about 5 minutes on 2 idle cores)
set -eu
cd "$(dirname "$0")/.."
steps=${1:-1000}
run=runs/quickstart
data=data/brown

sh scripts/setup-debian.sh
make -s
sh scripts/get-brown.sh "$data"
if [ ! -s "$data/train.tok" ] || [ ! -s "$data/val.tok" ]; then
	build/bin/dpc-shard prepare --force "$data/brown.jsonl" "$data"
fi
mkdir -p "$run"
build/bin/dpc-train-path --config configs/gpt-tiny.yaml --set train.steps="$steps" \
	--data "$data/train.tok" --val "$data/val.tok" --out "$run/model.safetensors" \
	--metrics "$run/metrics.jsonl" --resume >"$run/summary.json"
echo "trained: $(cat "$run/summary.json")"
echo "validation loss (nats/token) of $run/model.safetensors:"
build/bin/dpc-train-path --eval "$run/model.safetensors" --data "$data/val.tok"
