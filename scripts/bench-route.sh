#!/bin/sh
# bench-route.sh - what routing costs next to training, measured in one invocation:
#   1. training tokens/s of gpt-tiny (dpc-train-path, forward + backward + AdamW, 20 steps);
#   2. forward-only tokens/s of `dpc-route features` on the same model, with prefixes of 256
#      tokens (the training context: the same matrix shapes) and of 128;
#   3. tokens/s of `dpc-route score` (forward with the vocabulary head and log-softmax);
#   4. with QUICKSTART_RUN (default runs/quickstart, made by scripts/quickstart.sh): the
#      wall time of `dpc-route eval` re-routing every 64 tokens against routing once per
#      document, from the JSON it writes (both modes timed in the same process).
# Ratios are against the training tokens/s of step 1. The machine should be otherwise idle.
#
#   sh scripts/bench-route.sh [-t THREADS] [TOKFILE]   (default data/brown-1k/router.tok)
set -eu
cd "$(dirname "$0")/.."
threads=2
[ "${1:-}" = -t ] && { threads=$2; shift 2; }
tok=${1:-data/brown-1k/router.tok}
run=${QUICKSTART_RUN:-runs/quickstart}
bin=build/bin
[ -s "$tok" ] || { echo "bench-route.sh: '$tok': no such token file (run scripts/quickstart.sh)" >&2; exit 1; }
for p in dpc-train-path dpc-route; do
	[ -x "$bin/$p" ] || { echo "bench-route.sh: $bin/$p is not built (run make)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
field() { sed -n "s/.*\"$1\": *\\([0-9.e+-]*\\).*/\\1/p" "$2" | head -n 1; }

echo "bench-route.sh: $threads threads, $tok, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
$bin/dpc-train-path --config configs/gpt-tiny.yaml --set train.steps=20 --set train.eval_every=0 \
	--set train.checkpoint_every=0 --data "$tok" --output "$tmp/m.st" --threads "$threads" \
	--quiet >"$tmp/train.json"
train=$(field tokens_per_s "$tmp/train.json")
printf '%-44s %12.0f tokens/s\n' "training (gpt-tiny, B=8, T=256)" "$train"
for p in 256 128; do
	OMP_NUM_THREADS=$threads $bin/dpc-route features -q -t "$threads" --prefix $p -m "$tmp/m.st" \
		-o "$tmp/f$p.st" "$tok" >"$tmp/f$p.json"
	f=$(field tokens_per_s "$tmp/f$p.json")
	printf '%-44s %12.0f tokens/s  %5.2fx training\n' "features, prefix $p (forward only)" "$f" \
		"$(awk "BEGIN { print $f / $train }")"
done
$bin/dpc-route score -q -t "$threads" --path "$tmp/m.st" -o "$tmp/s.st" "$tok" >"$tmp/s.json"
s=$(field tokens_per_s "$tmp/s.json")
printf '%-44s %12.0f tokens/s  %5.2fx training\n' "score (forward with head, every token)" "$s" \
	"$(awk "BEGIN { print $s / $train }")"
if [ -s "$run/eval.json" ]; then
	d=$(sed -n '/"window": 0,/,/seconds/p' "$run/eval.json" | sed -n 's/.*"seconds": *\([0-9.e+-]*\).*/\1/p')
	w=$(sed -n '/"window": 64,/,/seconds/p' "$run/eval.json" | sed -n 's/.*"seconds": *\([0-9.e+-]*\).*/\1/p')
	if [ -n "$d" ] && [ -n "$w" ]; then
		printf '%-44s %8.1f s vs %.1f s: %.2fx\n' "eval every 64 tokens vs once per document" \
			"$w" "$d" "$(awk "BEGIN { print $w / $d }")"
	fi
else
	echo "(no $run/eval.json: run scripts/quickstart.sh for the evaluation's cost)"
fi
