# t-inspect.sh - looking inside files (issue 10, Inspection): dpc-shard cat decodes documents
# back to their text; dpc-train-path --info prints a checkpoint's metadata and tensors (the
# parameter count against the hand-computed one); --print-config prints a config with every
# default filled in, as YAML that loads back to the same config (the checkpoints trained from
# the original and from the printed one carry the same config_hash).
set -eu
. "$TESTDIR/lib.sh"
ROOT=$(cd "$TESTDIR/../.." && pwd)
for p in dpc-shard dpc-train-path; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
S=$BIN/dpc-shard
T=$BIN/dpc-train-path

# three documents of known text, all in train (no val, no router)
printf '%s\n' '{"id":"a","text":"first document, with a comma"}' \
	'{"id":"b","text":"second\nhas two lines"}' '{"id":"c","text":"third: caf\u00e9"}' >c.jsonl
expect_ok "$S" prepare --val-frac 0 --router-frac 0 c.jsonl d
expect_ok "$S" cat --json d/train.tok
[ "$(wc -l <out.stdout)" = 3 ] || die "cat --json: $(cat out.stdout)"
for want in '"meta":{"id":"a"},"text":"first document, with a comma"}' \
	'"meta":{"id":"b"},"text":"second\nhas two lines"}' '"meta":{"id":"c"},"text":"third: caf\u00E9"}'; do
	grep -qF "$want" out.stdout || die "cat --json lacks $want: $(cat out.stdout)"
done
n=$(grep -n '"id":"b"' out.stdout | cut -d: -f1)
expect_ok "$S" cat --doc $((n - 1)) d/train.tok
[ "$(cat out.stdout)" = "$(printf 'second\nhas two lines')" ] || die "cat --doc: '$(cat out.stdout)'"
expect_ok "$S" cat d/train.tok
[ "$(wc -c <out.stdout)" = $((28 + 1 + 20 + 1 + 12 + 1)) ] || die "cat: $(wc -c <out.stdout) bytes"
expect_fail 2 "^dpc-shard: 'd/train.tok': --doc 3: the file holds 3 documents$" "$S" cat --doc 3 d/train.tok

# --info: gpt-small-test (L=2, C=32, T=32, V=256): wte 8192 + wpe 1024 + 2 x (ln_1 64 + c_attn
# 3168 + c_proj 1056 + ln_2 64 + c_fc 4224 + c_proj 4128) + ln_f 64 + lm_head 8192 = 42880
cfg=$ROOT/configs/gpt-small-test.yaml
expect_ok "$T" -q -c "$cfg" -s train.steps=1 -d d/train.tok -o m.safetensors
expect_ok "$T" --info m.safetensors
tr -d ' \n' <out.stdout >info.json
for want in '"step":1,' '"params":42880,' '"optimizer_floats":85760,' '"kind":"path"' \
	'"name":"h.1.mlp.c_fc.weight","dtype":"F32","shape":[32,128],"numel":4096}'; do
	grep -qF "$want" info.json || die "--info lacks $want: $(head -c 600 info.json)"
done
[ "$(grep -o '"name":' info.json | wc -l)" = 87 ] || die "--info: not 87 tensors"

# --eval reports bits per token, and per byte with the byte tokenizer: loss / ln 2
expect_ok "$T" --eval m.safetensors -d d/train.tok
loss=$(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' out.stdout)
bpb=$(sed 's/.*"bits_per_byte":\([0-9.e+-]*\).*/\1/' out.stdout)
grep -q '"bits_per_token":' out.stdout || die "--eval: no bits_per_token: $(cat out.stdout)"
awk -v l="$loss" -v b="$bpb" 'BEGIN { d = l / log(2) - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }' ||
	die "--eval: bits_per_byte $bpb is not loss $loss / ln 2"

# --print-config: every key, as YAML that loads back; the same config_hash either way
expect_ok "$T" -c "$ROOT/configs/dipaco-2x2-head.yaml" -s train.lr=2e-3 --print-config
cp out.stdout printed.yaml
grep -q '^  lr: 0.002$' printed.yaml || die "--print-config: the override is not there"
grep -Eq '^  - name: "?head"?$' printed.yaml || die "--print-config: no levels"
expect_ok "$T" -c printed.yaml --print-config
same_file out.stdout printed.yaml
for c in "$ROOT/configs/dipaco-2x2-head.yaml" printed.yaml; do
	expect_ok "$T" -q -c "$c" -s train.lr=2e-3 -s model.seq_len=32 -u 1 \
		-d d/train.tok -o "h-$(basename "$c" .yaml).safetensors"
	expect_ok "$T" --info "h-$(basename "$c" .yaml).safetensors"
	grep '"config_hash"' out.stdout >>hashes.txt
done
[ "$(sort -u hashes.txt | wc -l)" = 1 ] || die "config hashes differ: $(cat hashes.txt)"
expect_fail 2 "^dpc-train-path: --print-config needs --config FILE$" "$T" --print-config
echo "inspect: cat, --info and --print-config agree with what went in"
