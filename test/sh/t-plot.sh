# t-plot.sh - scripts/plot.sh draws training curves (issue 10, curves): two runs' metrics, one
# with validation losses, make one PNG of the requested size; bad input is one line on stderr
# and exit 1 or 2, with no PNG written. Skips (77) without gnuplot.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
ROOT=$(cd "$TESTDIR/../.." && pwd)
PLOT="sh $ROOT/scripts/plot.sh"
command -v gnuplot >/dev/null || skip "skipped: no gnuplot (apt-get install gnuplot-nox)"
for p in dpc-shard dpc-train-path; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
make_corpus c.jsonl 40
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.2 --router-frac 0 c.jsonl d
cfg=$ROOT/configs/gpt-small-test.yaml
expect_ok "$BIN/dpc-train-path" -q -c "$cfg" -s train.steps=20 -s train.eval_every=5 -d d/train.tok \
	-v d/val.tok -o a.safetensors -m a.jsonl
expect_ok "$BIN/dpc-train-path" -q -c "$cfg" -s train.steps=20 -s train.lr=3e-3 -d d/train.tok \
	-o b.safetensors -m b.jsonl
expect_ok $PLOT -o curves.png --title "two runs" --log a.jsonl b.jsonl
grep -q '^plot.sh: wrote curves.png (2 runs)$' out.stdout || die "plot.sh: $(cat out.stdout)"
# a PNG of 1000 x 600: the signature, then IHDR's width and height (big-endian)
[ "$(od -An -tx1 -N8 curves.png | tr -d ' \n')" = 89504e470d0a1a0a ] || die "not a PNG"
[ "$(od -An -tx1 -j16 -N8 curves.png | tr -d ' \n')" = 000003e800000258 ] || die "not 1000 x 600"
[ "$(wc -c <curves.png)" -gt 10000 ] || die "a PNG of $(wc -c <curves.png) bytes: nothing drawn?"

expect_fail 2 "^plot.sh: no metrics file \(see --help\)$" $PLOT -o x.png
expect_fail 1 "^plot.sh: 'missing.jsonl': cannot read$" $PLOT -o x.png missing.jsonl
expect_fail 1 "^plot.sh: 'c.jsonl': no training lines" $PLOT -o x.png a.jsonl c.jsonl
expect_fail 2 "^plot.sh: unknown option '--width' \(see --help\)$" $PLOT --width 3 a.jsonl
[ ! -e x.png ] || die "a failed plot wrote its PNG"
echo "plot: two runs with validation points, one PNG; bad input refused"
