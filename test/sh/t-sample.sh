# t-sample.sh - dpc-route sample (issue 10, Sampling): the key/value cache changes nothing but
# the speed (greedy text with and without it is the same over 300 tokens, past the model's
# 32-token context many times over, so the context shift is the same too); a seed fixes the
# text; -n counts the bytes written; a prompt reads from standard input with '-'; bad options
# are one line, exit 2. (The logits themselves are checked against the full forward at every
# position in test/unit/test_gpt2_decode.c, the sampler's cuts in test_sample.c.)
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
ROOT=$(cd "$TESTDIR/../.." && pwd)
for p in dpc-route dpc-train-path dpc-shard; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
R=$BIN/dpc-route
make_corpus c.jsonl 40
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
expect_ok "$BIN/dpc-train-path" -q -c "$ROOT/configs/gpt-small-test.yaml" -s train.steps=40 \
	-d d/train.tok -o m.safetensors

"$R" sample -m m.safetensors -n 300 --temperature 0 "The " >cache.txt 2>cache.err ||
	die "sample: $(cat cache.err)"
"$R" sample -m m.safetensors -n 300 --temperature 0 --no-cache "The " >full.txt 2>full.err ||
	die "sample --no-cache: $(cat full.err)"
[ "$(wc -c <cache.txt)" = 300 ] || die "-n 300 wrote $(wc -c <cache.txt) bytes"
same_file cache.txt full.txt
grep -q '^dpc-route sample: 300 tokens in .* tokens/s after a 4-token prompt .*key/value cache; seed 1$' \
	cache.err || die "summary: $(cat cache.err)"

"$R" sample -m m.safetensors -n 120 -s 7 --top-k 20 --top-p 0.9 -q "The " >s7a.txt
"$R" sample -m m.safetensors -n 120 -s 7 --top-k 20 --top-p 0.9 -q "The " >s7b.txt
"$R" sample -m m.safetensors -n 120 -s 8 --top-k 20 --top-p 0.9 -q "The " >s8.txt
same_file s7a.txt s7b.txt
cmp -s s7a.txt s8.txt && die "seeds 7 and 8 gave the same 120 bytes"
printf 'The ' | "$R" sample -m m.safetensors -n 120 -s 7 --top-k 20 --top-p 0.9 -q - >stdin.txt
same_file s7a.txt stdin.txt

expect_fail 2 "^dpc-route: sample: --model FILE is required" "$R" sample "The "
expect_fail 2 "^dpc-route: option '--top-p': " "$R" sample -m m.safetensors --top-p 0 x
expect_fail 2 "^dpc-route: sample: the text goes to standard output; there is no --output$" \
	"$R" sample -m m.safetensors -o out.txt x
expect_fail 2 "^dpc-route: sample: --router routes the paths of a DiPaCo: it needs --run RUNDIR or --path CKPT$" \
	"$R" sample -m m.safetensors --router r.st x
expect_fail 2 "^dpc-route: sample: 2 paths need a --router$" \
	"$R" sample --path m.safetensors --path m.safetensors -m m.safetensors x
expect_fail 1 "^dpc-route: 'd/val.tok': not a safetensors file: a token file" \
	"$R" sample -m d/val.tok x
echo "sample: the cache gives the full forward's text; seeds fix the text"
