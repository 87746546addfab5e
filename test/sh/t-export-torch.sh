# t-export-torch.sh - dpc-train-path --export writes a Hugging Face GPT-2 directory
# (issue 10, "Export"): loaded as GPT2LMHeadModel with strict=True (transformers' own when
# installed, else the module tree rebuilt from its documented layout by
# test/ref/hf_export_check.py), its loss over the --eval windows equals dpc-train-path
# --eval's to 1e-5 relative. Also: --export needs --out, refuses to replace without --force,
# and names a file that is not a checkpoint.
# Skips (77) without PyTorch in /usr/bin/python3 or without the programs.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"

PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
T=$BIN/dpc-train-path
need_torch
for p in dpc-train-path dpc-shard; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
cfg=$ROOT/configs/gpt-small-test.yaml

make_corpus c.jsonl 40
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.2 --router-frac 0 c.jsonl d
expect_ok "$T" -q -c "$cfg" -s train.steps=30 -d d/train.tok -o m.safetensors
expect_ok "$T" --export m.safetensors -o hf/model
grep -q '"files":\["model.safetensors","config.json","tokenizer.json","tokenizer_config.json"\]' out.stdout ||
	die "export: $(cat out.stdout)"
expect_ok "$T" --eval m.safetensors -d d/val.tok --max-tokens 4096
ours=$(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' out.stdout)
"$PY" "$ROOT/test/ref/hf_export_check.py" hf/model d/val.tok 4096 >hf.json ||
	die "the exported directory does not load as GPT2LMHeadModel"
theirs=$(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' hf.json)
awk -v a="$ours" -v b="$theirs" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' ||
	die "--eval loss $ours, GPT2LMHeadModel ($(cat hf.json)) $theirs"

# errors: no --out; an existing export; not a checkpoint
expect_fail 2 "^dpc-train-path: --export needs --output DIR, the directory to write$" \
	"$T" --export m.safetensors
expect_fail 1 "^dpc-train-path: 'hf/model/model.safetensors': exists \(use --force to replace it\)$" \
	"$T" --export m.safetensors -o hf/model
expect_ok "$T" --export m.safetensors -o hf/model --force
expect_fail 1 "^dpc-train-path: 'd/val.tok': not a safetensors file: a token file" \
	"$T" --export d/val.tok -o hf/other
[ ! -e hf/other/model.safetensors ] || die "a failed export wrote a file"
echo "export: GPT2LMHeadModel ($(sed 's/.*"impl":"\([a-z]*\)".*/\1/' hf.json), strict) loss $theirs = --eval $ours"
