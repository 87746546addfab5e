#!/bin/sh
# brown-1k.sh - the Brown data of the quickstart and of reproduce.sh: the corpus fetched into
# data/brown (scripts/get-brown.sh), then prepared into byte-level token files in
# data/brown-1k with every document cut into 1024-token pieces that keep their genre: train,
# router (3% of the source documents) and val (5%). One definition, so that the two scripts
# train and evaluate on the same split. Also data/brown/train.tok and val.tok, the whole
# documents as `dpc-shard prepare` splits them by default: the benchmarks' and the README's
# examples' data (scripts/bench-*.sh, dipaco-train.sh ... data/brown/train.tok).
#
#   sh scripts/brown-1k.sh [BIN]      (BIN: the programs, default build/bin)
#
# Idempotent: a prepared folder (its val.tok there) is left alone.
set -eu
cd "$(dirname "$0")/.."
bin=${1:-build/bin}
sh scripts/get-brown.sh data/brown
if [ ! -s data/brown-1k/val.tok ]; then
	"$bin/dpc-shard" prepare --force --chunk 1024 --val-frac 0.05 --router-frac 0.03 \
		data/brown/brown.jsonl data/brown-1k >/dev/null
fi
if [ ! -s data/brown/val.tok ]; then
	"$bin/dpc-shard" prepare --force data/brown/brown.jsonl data/brown >/dev/null
fi
