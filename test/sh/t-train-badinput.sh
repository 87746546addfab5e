# Bad input is refused: exit 1 or 2, one stderr line naming the file and the problem, and
# no output written or overwritten.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
root=$TESTDIR/../..
cfg=$root/configs/gpt-small-test.yaml
T=$BIN/dpc-train-path
make_corpus c.jsonl 40
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
expect_ok "$T" -q -c "$cfg" -s train.steps=3 -d d/train.tok -o good.safetensors
size=$(wc -c <good.safetensors)

# the output must never be touched by a failed run: keep a sentinel there
sentinel() { echo sentinel >out.safetensors; }
untouched() { [ "$(cat out.safetensors)" = sentinel ] || die "output was overwritten"; }

# devices: one that does not exist is a usage error naming those built; cuda, when this binary
# was built without it, is a usage error too, and when it was built but this machine has no
# GPU, a runtime error (exit 1) saying so
sentinel
expect_fail 2 "^dpc-train-path: unknown device 'nosuch' \(built: cpu, ref(, cuda)?\)$" \
	"$T" --device=nosuch -q -c "$cfg" -d d/train.tok -f -o out.safetensors
if ! grep -q 'built: cpu, ref, cuda' out.stderr; then
	expect_fail 2 "^dpc-train-path: device 'cuda' is not built into this binary \(.*; built: cpu, ref\)$" \
		"$T" --device cuda -q -c "$cfg" -d d/train.tok -f -o out.safetensors
elif ! nvidia-smi -L >/dev/null 2>&1; then
	expect_fail 1 "^dpc-train-path: no usable CUDA device here \(.*\)$" \
		"$T" --device cuda -q -c "$cfg" -d d/train.tok -f -o out.safetensors
fi
# precisions: an unknown one names the three; one the device lacks names the device and what
# it has (ref computes in fp32 only, cpu in fp32 and bf16); bf16 on a cpu whose library or
# processor lacks it says why (here: OpenBLAS forced, which has no bf16 kernel in the backend)
expect_fail 2 "^dpc-train-path: option '--precision': unknown precision 'fp16' \(fp32, tf32 or bf16\)$" \
	"$T" --precision fp16 -q -c "$cfg" -d d/train.tok -f -o out.safetensors
expect_fail 2 "^dpc-train-path: device 'ref' has no bf16 matrix products \(it has: fp32\)$" \
	"$T" --device ref --precision bf16 -q -c "$cfg" -d d/train.tok -f -o out.safetensors
expect_fail 2 "^dpc-train-path: device 'cpu' has no tf32 matrix products \(it has: fp32, bf16\)$" \
	"$T" --device cpu --precision tf32 -q -c "$cfg" -d d/train.tok -f -o out.safetensors
expect_fail 2 "^dpc-train-path: device 'cpu' has no bf16 matrix products here: the matrix products run on OpenBLAS, .*$" \
	env CORE_CPU_BLAS=openblas "$T" --device cpu --precision bf16 -q -c "$cfg" -d d/train.tok -f -o out.safetensors
expect_fail 2 "^dpc-train-path: cpu backend: CORE_CPU_BLAS='mkl': not a library \(onednn, openblas\)$" \
	env CORE_CPU_BLAS=mkl "$T" -q -c "$cfg" -d d/train.tok -f -o out.safetensors
untouched
# the reference backend evaluates the same checkpoint to the same loss (1e-5 relative)
expect_ok "$T" --eval good.safetensors -d d/val.tok --max-tokens 2048
cpu=$(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' out.stdout)
expect_ok "$T" --device ref --eval good.safetensors -d d/val.tok --max-tokens 2048
ref=$(sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' out.stdout)
awk -v a="$cpu" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' ||
	die "loss on cpu $cpu, on ref $ref"

# truncated checkpoint
head -c $((size - 100)) good.safetensors >trunc.safetensors
sentinel
expect_fail 1 "dpc-train-path: 'trunc.safetensors': .*(truncated|short|size)" \
	"$T" -q -c "$cfg" -d d/train.tok -i trunc.safetensors -f -o out.safetensors
untouched
head -c 5 good.safetensors >tiny.safetensors
expect_fail 1 "'tiny.safetensors'" "$T" --eval tiny.safetensors -d d/val.tok

# one bit flipped in the data section
cp good.safetensors flip.safetensors
off=$((size - 50))
byte=$(od -An -tu1 -j $off -N1 flip.safetensors | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of=flip.safetensors bs=1 seek=$off conv=notrunc 2>/dev/null
expect_fail 1 "'flip.safetensors': .*checksum" "$T" --eval flip.safetensors -d d/val.tok
sentinel
expect_fail 1 "'flip.safetensors': .*checksum" \
	"$T" -q -c "$cfg" -d d/train.tok -i flip.safetensors -f -o out.safetensors
untouched

# a checkpoint of another shape than the config
expect_ok "$T" -q -c "$cfg" -s model.n_embd=64 -s train.steps=1 -d d/train.tok -o wide.safetensors
sentinel
expect_fail 1 "'wide.safetensors': .*(shape|model is)" \
	"$T" -q -c "$cfg" -d d/train.tok -i wide.safetensors -f -o out.safetensors
untouched

# token files: truncated, bit-flipped, wrong magic, wrong version
tsize=$(wc -c <d/train.tok)
head -c $((tsize - 7)) d/train.tok >trunc.tok
expect_fail 1 "'trunc.tok': " "$T" -q -c "$cfg" -d trunc.tok -f -o out.safetensors
cp d/train.tok flip.tok
byte=$(od -An -tu1 -j $((tsize - 3)) -N1 flip.tok | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of=flip.tok bs=1 seek=$((tsize - 3)) conv=notrunc 2>/dev/null
expect_fail 1 "'flip.tok': .*checksum" "$T" -q -c "$cfg" -d flip.tok -f -o out.safetensors
cp d/train.tok magic.tok
printf 'XXXXXXXX' | dd of=magic.tok bs=1 seek=0 conv=notrunc 2>/dev/null
expect_fail 1 "'magic.tok': .*(not a token file|magic)" "$T" --eval good.safetensors -d magic.tok
cp d/train.tok version.tok
printf '\011' | dd of=version.tok bs=1 seek=8 conv=notrunc 2>/dev/null
expect_fail 1 "'version.tok': .*version" "$T" --eval good.safetensors -d version.tok
untouched

# configs: malformed YAML, unknown key, wrong type, out of range
printf 'model:\n  n_layer: [1, 2\n' >bad.yaml
expect_fail 2 "'bad.yaml': .*line" "$T" -q -c bad.yaml -d d/train.tok -f -o out.safetensors
printf 'model:\n  n_layer: 2\ntrain:\n  setps: 10\n' >unknown.yaml
expect_fail 2 "'unknown.yaml': line 4: .*setps" "$T" -q -c unknown.yaml -d d/train.tok -f -o out.safetensors
printf 'train:\n  lr: fast\n' >type.yaml
expect_fail 2 "'type.yaml': line 2: .*lr" "$T" -q -c type.yaml -d d/train.tok -f -o out.safetensors
expect_fail 2 "train.lr" "$T" -q -c "$cfg" -s train.lr=-1 -d d/train.tok -f -o out.safetensors
untouched

# usage errors
expect_fail 2 "dpc-train-path: " "$T" --bogus
expect_fail 2 "^dpc-train-path: option '--resume' takes no argument" "$T" --resume=1
expect_fail 2 "^dpc-train-path: unknown option '-z'" "$T" --until=3 -qz
expect_fail 2 "^dpc-train-path: unknown option '-z'" "$T" --until=3 -zq
expect_fail 2 "--data" "$T" -c "$cfg" -f -o out.safetensors
expect_fail 2 "--threads" "$T" -t zero -c "$cfg" -d d/train.tok -f -o out.safetensors

# crafted defects that keep the checksums right (needs python3 for the crafting only)
if [ -x /usr/bin/python3 ]; then
	/usr/bin/python3 "$TESTDIR/stedit.py" good.safetensors nan.safetensors nan h.0.mlp.c_fc.weight
	sentinel
	expect_fail 1 "NaN" "$T" -q -c "$cfg" -s train.steps=5 -d d/train.tok -i nan.safetensors -f -o out.safetensors
	untouched
	/usr/bin/python3 "$TESTDIR/stedit.py" good.safetensors shape.safetensors reshape h.1.attn.c_proj.weight 16 32
	expect_fail 1 "'shape.safetensors': .*h.1.attn.c_proj.weight.*shape" \
		"$T" -q -c "$cfg" -d d/train.tok -i shape.safetensors -f -o out.safetensors
	untouched
	expect_fail 1 "'shape.safetensors': .*h.1.attn.c_proj.weight" "$T" --eval shape.safetensors -d d/val.tok
else
	echo "python3 missing: crafted NaN / wrong-shape checkpoint cases not run"
fi
# An existing checkpoint is continued (--resume) or replaced (--force), never overwritten by a
# plain run (issue 10, item 3); nor does a new run append its metrics after an old run's.
cp good.safetensors keep.safetensors
expect_fail 1 "^dpc-train-path: 'keep.safetensors': exists \(use --resume to continue it or --force to replace it\)$" \
	"$T" -q -c "$cfg" -s train.steps=3 -d d/train.tok -o keep.safetensors
same_file keep.safetensors good.safetensors
expect_fail 1 "^dpc-train-path: 'keep.safetensors': exists" \
	"$T" -q -c "$cfg" -s train.steps=3 -d d/train.tok -i good.safetensors -o keep.safetensors
same_file keep.safetensors good.safetensors
expect_ok "$T" -q -c "$cfg" -s train.steps=2 -d d/train.tok -o m1.safetensors -m m.jsonl
expect_fail 1 "^dpc-train-path: 'm.jsonl': exists \(a run continued with --resume appends to it; use --force to start it afresh\)$" \
	"$T" -q -c "$cfg" -s train.steps=2 -d d/train.tok -o m2.safetensors -m m.jsonl
[ ! -e m2.safetensors ] || die "a refused run wrote its checkpoint"
# continued: the metrics go on (steps 1 2 then 3 4); forced: replaced and started afresh (1 2)
expect_ok "$T" -q -c "$cfg" -s train.steps=4 -d d/train.tok -o m1.safetensors -m m.jsonl -r
[ "$(sed 's/.*"step":\([0-9]*\).*/\1/' m.jsonl | tr '\n' ' ')" = "1 2 3 4 " ] ||
	die "--resume: metrics steps $(sed 's/.*"step":\([0-9]*\).*/\1/' m.jsonl | tr '\n' ' ')"
expect_ok "$T" -q -c "$cfg" -s train.steps=2 -d d/train.tok -o m1.safetensors -m m.jsonl -f
[ "$(sed 's/.*"step":\([0-9]*\).*/\1/' m.jsonl | tr '\n' ' ')" = "1 2 " ] ||
	die "--force: metrics steps $(sed 's/.*"step":\([0-9]*\).*/\1/' m.jsonl | tr '\n' ' ')"
grep -q '"step":2,' out.stdout || die "--force did not train afresh: $(cat out.stdout)"

# Small wrong answers (issue 10, item 6), each of which the old code gave:
# a bare call names what to do, not one missing option
expect_fail 2 "^dpc-train-path: no arguments: train with -c CONFIG .*see --help\)$" "$T"
# a token file given as a checkpoint is named as such, not as an insane header length
expect_fail 1 "'d/val.tok': not a safetensors file: a token file \(dpc-tokens\(5\)\)$" \
	"$T" --eval d/val.tok -d d/val.tok
expect_fail 1 "'$cfg': not a safetensors file \(its first 8 bytes give a header length of" \
	"$T" --eval "$cfg" -d d/val.tok
# --until past the schedule's end is refused, naming the key to raise
sentinel
expect_fail 2 "^dpc-train-path: --until 9 is past train.steps = 3, .*-s train.steps=9\)$" \
	"$T" -q -c "$cfg" -s train.steps=3 -u 9 -d d/train.tok -f -o out.safetensors
untouched
# a run with nothing to do reports no loss and no rate (null), not 0.0
cp good.safetensors done.safetensors
expect_ok "$T" -q -c "$cfg" -s train.steps=3 -d d/train.tok -o done.safetensors -r
grep -q '"steps":0,"step":3,"loss":null,"val_loss":null,"tokens_per_s":null,' out.stdout ||
	die "nothing-to-do run: $(cat out.stdout)"
# an output in directories that do not exist yet gets them
expect_ok "$T" -q -c "$cfg" -s train.steps=1 -d d/train.tok -o new/a/b.safetensors -m new/m/m.jsonl
[ -s new/a/b.safetensors ] && [ -s new/m/m.jsonl ] || die "-o/-m in new directories: not written"
echo "every bad input refused with one line, outputs untouched"
