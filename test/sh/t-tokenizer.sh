#!/bin/sh
# t-tokenizer.sh - SentencePiece tokens end to end in dpc-shard: `tokenizer train` (the model's
# id against zlib's checksums of its bytes, the same file twice), `prepare --tokenizer
# spm:MODEL` (every document's tokens against spm_encode, SentencePiece's own command, and
# against its Python module where python3-sentencepiece is installed), `cat` decoding back to
# the source text, and the refusals: another tokenizer at cat, no model, a file that is no
# model, bad options, an existing model; then dpc-train-path, dpc-route and a DiPaCo run on
# those tokens: the tokenizer recorded in checkpoints and modules, and every mismatch refused
# in one line. Skipped in a build without SentencePiece.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
S=$BIN/dpc-shard
PY=/usr/bin/python3
# field NAME FILE: an integer field of dpc-shard info's JSON
field() { "$S" info "$2" | sed -n "s/^  \"$1\": \([0-9][0-9]*\),*\$/\1/p"; }

# 300 documents of generated English, and a few with what the model must keep: several
# spaces, tabs, new lines, characters it never saw (byte pieces), an empty text.
make_corpus in.jsonl 300
cat >>in.jsonl <<'END'
{"text":"two  spaces,\ttabs\tand\nnew lines\n\n","id":300}
{"text":"caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \ud83d\ude00 the fox","id":301}
{"text":"","id":302}
{"text":" leading and trailing space ","id":303}
END

"$S" tokenizer train -o m.model --vocab 300 in.jsonl >train.json 2>train.err && rc=0 || rc=$?
if [ $rc -ne 0 ] && grep -q "no SentencePiece" train.err; then
	skip "skipped: this build has no SentencePiece ($(cat train.err))"
fi
[ $rc -eq 0 ] || { cat train.err; die "tokenizer train exited $rc"; }
command -v spm_encode >/dev/null || skip "skipped: no spm_encode (apt-get install sentencepiece)"

# the id: crc32 << 32 | adler32 of the file's bytes, computed here by Python's zlib
want=$("$PY" -c 'import sys, zlib; b = open(sys.argv[1], "rb").read()
print("spm-%08x%08x" % (zlib.crc32(b), zlib.adler32(b)))' m.model)
grep -q "\"tokenizer\": \"$want\"" train.json || die "train: id is not $want: $(cat train.json)"
grep -q '"docs": 304' train.json || die "train: not 304 documents: $(cat train.json)"
expect_ok "$S" tokenizer info spm:m.model
grep -q "\"tokenizer\": \"$want\"" out.stdout || die "info: $(cat out.stdout)"
grep -q '"vocab": 300' out.stdout || die "info: $(cat out.stdout)"
# deterministic: the same input and options give the same bytes
expect_ok "$S" tokenizer train -q -o m2.model --vocab 300 in.jsonl
same_file m.model m2.model
# --train-split: the documents prepare puts in train.tok, no others
expect_ok "$S" tokenizer train -q -o split.model --vocab 300 --train-split --val-frac 0.1 \
	--router-frac 0.05 --seed 3 in.jsonl
ndocs=$(sed -n 's/^  "docs": \([0-9]*\),$/\1/p' out.stdout)
expect_ok "$S" prepare --val-frac 0.1 --router-frac 0.05 --seed 3 in.jsonl bytes3
ntrain=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["train"]["docs"])' \
	out.stdout)
[ "$ndocs" = "$ntrain" ] || die "--train-split learnt from $ndocs documents, train.tok has $ntrain"

# prepare with the model: the header names it, every split
expect_ok "$S" prepare --val-frac 0.1 --router-frac 0.05 --seed 3 --tokenizer spm:m.model \
	in.jsonl out
grep -q "\"tokenizer_id\": \"$want\"" out.stdout || die "prepare: $(cat out.stdout)"
for s in train val router; do
	expect_ok "$S" info "out/$s.tok"
	grep -q "\"tokenizer\": \"$want\"" out.stdout || die "info $s.tok: $(cat out.stdout)"
	grep -q '"version": 2' out.stdout || die "info $s.tok: $(cat out.stdout)"
done

# The tokens of every document, read from the token files by dpc-tokens(5) (docs.py), against
# spm_encode on the one-line texts (it encodes a line at a time) and against the Python module
# on all of them.
cat >docs.py <<'END'
import json, struct, sys
def docs(path):
    b = open(path, "rb").read()
    ver, vocab, nd, nt, w = struct.unpack_from("<IIQQI", b, 8)
    body = 64
    tok = struct.unpack_from("<%d%s" % (nt, "H" if w == 2 else "I"), b, body)
    at = body + (nt * w + 7) // 8 * 8
    off = struct.unpack_from("<%dQ" % (nd + 1), b, at)
    moff = struct.unpack_from("<%dQ" % (nd + 1), b, at + 8 * (nd + 1))
    meta = at + 16 * (nd + 1)
    for d in range(nd):
        m = json.loads(b[meta + moff[d]:meta + moff[d + 1]])
        yield m["id"], list(tok[off[d]:off[d + 1]])
src = {}
for line in open("in.jsonl"):
    o = json.loads(line)
    src[o["id"]] = o["text"]
got = {}
for s in ("train", "val", "router"):
    got.update(docs("out/%s.tok" % s))
assert sorted(got) == sorted(src), "documents lost"
# one-line texts for spm_encode, in id order; and the ids of those lines
with open("lines.txt", "w") as f, open("lines.ids", "w") as g:
    for i in sorted(src):
        t = src[i]
        if t and "\n" not in t:
            f.write(t + "\n")
            g.write(" ".join(map(str, got[i])) + "\n")
try:
    import sentencepiece
except ImportError:
    print("no python3-sentencepiece: the multi-line texts checked by cat only")
    sys.exit(0)
sp = sentencepiece.SentencePieceProcessor(model_file="m.model")
for i in sorted(src):
    want = sp.encode(src[i])
    assert got[i] == want, "document %d: %s, SentencePiece says %s" % (i, got[i][:20], want[:20])
print("python: %d documents equal" % len(src))
END
"$PY" docs.py
spm_encode --model=m.model --output_format=id <lines.txt >spm.ids
[ "$(wc -l <spm.ids)" -ge 300 ] || die "spm_encode gave $(wc -l <spm.ids) lines"
cmp -s spm.ids lines.ids || { diff spm.ids lines.ids | head -5; die "tokens differ from spm_encode's"; }
# fewer tokens than bytes, on the same documents: it learnt pieces
nb=$(field tokens bytes3/train.tok) ns=$(field tokens out/train.tok)
[ $((ns * 3)) -lt $((nb * 2)) ] || die "$ns SentencePiece tokens for $nb bytes"

# cat decodes with the model, back to the source texts byte for byte
expect_ok "$S" cat --json --tokenizer spm:m.model out/train.tok
"$PY" - <<'END'
import json
src = {json.loads(l)["id"]: json.loads(l)["text"] for l in open("in.jsonl")}
n = 0
for line in open("out.stdout"):
    o = json.loads(line)
    assert o["text"] == src[o["meta"]["id"]], (o["text"][:60], src[o["meta"]["id"]][:60])
    n += 1
assert n > 200, n
END
expect_ok "$S" cat --tokenizer spm:m.model --doc 0 out/val.tok

# refusals, one line each: the byte tokenizer, no tokenizer, another model (BPE), not a model
expect_fail 2 "out/val.tok': tokenizer $want, not the one given \(byte\)" \
	"$S" cat --tokenizer byte out/val.tok
expect_fail 2 "val.tok': made with tokenizer $want, a vocabulary of 300: give its model with --tokenizer spm:MODEL$" \
	"$S" cat out/val.tok
expect_ok "$S" tokenizer train -q -o bpe.model --type bpe --vocab 300 in.jsonl
expect_fail 2 "val.tok': tokenizer $want, not the one given \(spm:bpe.model, which is spm-" \
	"$S" cat --tokenizer spm:bpe.model out/val.tok
echo "not a model" >junk.model
expect_fail 1 "junk.model.*SentencePiece" "$S" cat --tokenizer spm:junk.model out/val.tok
expect_fail 1 "junk.model.*SentencePiece" "$S" prepare --tokenizer spm:junk.model in.jsonl o2
[ ! -e o2 ] || die "a failed prepare left o2"
expect_fail 1 "missing.model" "$S" tokenizer info spm:missing.model
expect_fail 2 "unknown tokenizer 'gpt2'" "$S" prepare --tokenizer gpt2 in.jsonl o2

# training refusals: nothing written, the old model kept
cp m.model keep.model
expect_fail 1 "m.model': exists \(use --force" "$S" tokenizer train -o m.model --vocab 300 in.jsonl
same_file m.model keep.model
expect_fail 2 "--vocab.*outside \[260, 1048576\]" "$S" tokenizer train -o x.model --vocab 100 in.jsonl
expect_fail 2 "needs --output MODEL and --vocab N" "$S" tokenizer train --vocab 300 in.jsonl
expect_fail 2 "--val-frac and --router-frac go with --train-split" \
	"$S" tokenizer train -o x.model --vocab 300 --val-frac 0.5 in.jsonl
expect_fail 2 "'wordpiece' is no model type" "$S" tokenizer train -o x.model --type wordpiece \
	--vocab 300 in.jsonl
expect_fail 2 "tokenizer: 'encode' is no command" "$S" tokenizer encode
expect_fail 1 "x.model.*Vocabulary size too high" "$S" tokenizer train -q -o x.model \
	--vocab 50000 in.jsonl
: >empty.jsonl
expect_fail 1 "empty.jsonl': holds no documents" "$S" tokenizer train -q -o x.model \
	--vocab 300 empty.jsonl
printf '{"text":"ok"}\nnot json\n' >bad.jsonl
expect_fail 1 "bad.jsonl.*line 2" "$S" tokenizer train -q -o x.model --vocab 300 bad.jsonl
[ ! -e x.model ] || die "a failed training left x.model"
ls | grep -q 'tmp' && die "temporary files left: $(ls)"
# ---- every program that meets tokens checks the tokenizer ------------------------------------
# spm.st trained on m.model's tokens, byte.st on bytes; bpe/ holds the same documents in
# another model's tokens of the same vocabulary (300), so only the tokenizer tells them apart.
T=$BIN/dpc-train-path R=$BIN/dpc-route O=$BIN/dpc-outer
ROOT=$(cd "$TESTDIR/../.." && pwd)
cfg="$ROOT/configs/gpt-small-test.yaml"
bpe_id=$("$S" tokenizer info spm:bpe.model | sed -n 's/^  "tokenizer": "\(.*\)",$/\1/p')
expect_ok "$S" prepare --val-frac 0.1 --router-frac 0.05 --seed 3 --tokenizer spm:bpe.model \
	in.jsonl bpe
expect_ok "$T" -q -c "$cfg" -s model.vocab_size=300 -s train.steps=20 -d out/train.tok \
	-v out/val.tok -o spm.st
expect_ok "$T" -q -c "$cfg" -s train.steps=5 -d bytes3/train.tok -o byte.st
# meta FILE KEY: a safetensors file's metadata value
meta() { "$PY" -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
print(json.loads(raw[8:8 + n]).get("__metadata__", {}).get(sys.argv[2], "-"))' "$1" "$2"; }
[ "$(meta spm.st tokenizer)" = "$want" ] || die "spm.st records '$(meta spm.st tokenizer)'"
[ "$(meta byte.st tokenizer)" = byte ] || die "byte.st records '$(meta byte.st tokenizer)'"

# training: the config's vocabulary; a validation file, a checkpoint to start from, another
# tokenizer's
expect_fail 1 "out/train.tok': a vocabulary of 300, the model's is 256 \(model.vocab_size" \
	"$T" -q -c "$cfg" -s train.steps=2 -d out/train.tok -o x.st
expect_fail 2 "bpe/val.tok': tokens of tokenizer $bpe_id, the model was trained on tokens of $want" \
	"$T" -q -c "$cfg" -s model.vocab_size=300 -s train.steps=2 -d out/train.tok \
	-v bpe/val.tok -o x.st
expect_fail 2 "bpe/train.tok': tokens of tokenizer $bpe_id, the model was trained on tokens of $want" \
	"$T" -q -c "$cfg" -s model.vocab_size=300 -s train.steps=2 --weights spm.st \
	-d bpe/train.tok -o x.st
# evaluation
expect_ok "$T" --eval spm.st -d out/val.tok
expect_fail 2 "bpe/val.tok': tokens of tokenizer $bpe_id, the model was trained on tokens of $want" \
	"$T" --eval spm.st -d bpe/val.tok
expect_fail 1 "bytes3/val.tok': a vocabulary of 256, the model's is 300" \
	"$T" --eval spm.st -d bytes3/val.tok
# routing: a router's features come from a base model, which must be of the tokens routed
expect_ok "$R" features -q -m spm.st -o f.feat out/train.tok
expect_fail 2 "bpe/train.tok': tokens of tokenizer $bpe_id, the model was trained on tokens of $want" \
	"$R" features -q -m spm.st -o g.feat bpe/train.tok
# evaluation per byte: the bytes the scored tokens stand for (every token from position 32 of
# each document longer than that), counted here from SentencePiece's pieces
expect_ok "$R" eval -q --path spm.st -m spm.st --tokenizer spm:m.model --json e.json out/val.tok
grep -q "nats/byte" out.stdout || die "eval's table has no nats/byte: $(cat out.stdout)"
"$PY" - <<'END' || die "eval's bytes are not SentencePiece's"
import json, struct, sys
e = json.load(open("e.json"))
raw = open("out/val.tok", "rb").read()
_, vocab, nd, nt, w = struct.unpack_from("<IIQQI", raw, 8)
tok = struct.unpack_from("<%dH" % nt, raw, 64)
off = struct.unpack_from("<%dQ" % (nd + 1), raw, 64 + (nt * w + 7) // 8 * 8)
try:
    import sentencepiece
except ImportError:
    sys.exit(0)
sp = sentencepiece.SentencePieceProcessor(model_file="m.model")
def nbytes(i):
    if sp.is_byte(i): return 1
    if sp.is_control(i) or sp.is_unknown(i): return 0
    return len(sp.id_to_piece(i).replace("\u2581", " ").encode())
F = e["score_from"]
scored = [t for d in range(nd) for t in tok[off[d] + F:off[d + 1]]]
assert len(scored) == e["tokens"], (len(scored), e["tokens"])
assert e["bytes"] == sum(nbytes(t) for t in scored), (e["bytes"], sum(nbytes(t) for t in scored))
m = e["modes"][0]
# both numbers are written to 9 significant digits (lib/common/jsonfmt.h): up to 5e-9 of each
# off, so 2e-8 between them (1e-9 failed on some runs' values)
assert abs(m["nats_per_byte"] - m["loss"] * m["tokens"] / e["bytes"]) < 2e-8 * m["nats_per_byte"]
assert e["tokenizer"].startswith("spm-")
END
expect_fail 2 "out/val.tok': tokenizer $want, not the one given \(spm:bpe.model" \
	"$R" eval -q --path spm.st -m spm.st --tokenizer spm:bpe.model out/val.tok
# a model of bytes: a token is a byte
expect_ok "$R" eval -q --path byte.st -m byte.st --json eb.json bytes3/val.tok
"$PY" -c 'import json; e = json.load(open("eb.json")); assert e["bytes"] == e["tokens"], e' ||
	die "bytes of byte tokens: $(cat eb.json)"

# sampling: the prompt encoded with the model's tokenizer (as many tokens as SentencePiece's
# Python module makes of it), the text written token by token (test_tokenizer.c checks those
# bytes against SentencePiece's decoding)
expect_ok "$R" sample -m spm.st --tokenizer spm:m.model -n 40 --temperature 0 "the fox "
cp out.stdout spm-sample.txt
cp out.stderr spm-sample.err
expect_ok "$R" sample -m spm.st --tokenizer spm:m.model -n 40 --temperature 0 --no-cache "the fox "
same_file out.stdout spm-sample.txt
ptoks=$("$PY" -c 'import sentencepiece as s; print(len(s.SentencePieceProcessor(model_file="m.model").encode("the fox ")))' 2>/dev/null || echo "")
[ -z "$ptoks" ] || grep -q "after a $ptoks-token prompt" spm-sample.err ||
	die "sample's prompt is not $ptoks tokens: $(cat spm-sample.err)"
[ -s spm-sample.txt ] || die "40 tokens drawn, nothing written"
expect_fail 2 "spm.st': made with tokenizer $want, a vocabulary of 300: give its model with --tokenizer spm:MODEL$" \
	"$R" sample -m spm.st x
expect_fail 2 "spm.st': tokenizer $want, not the one given \(byte\)" \
	"$R" sample -m spm.st --tokenizer byte x
expect_fail 2 "spm.st': tokenizer $want, not the one given \(spm:bpe.model, which is $bpe_id\)" \
	"$R" sample -m spm.st --tokenizer spm:bpe.model x
expect_fail 2 "byte.st': tokenizer byte, not the one given \(spm:m.model, which is $want\)" \
	"$R" sample -m byte.st --tokenizer spm:m.model x

# DiPaCo: paths and modules record the shards' tokenizer; a run forked from spm.st refuses
# shards of another
small="-s model.vocab_size=300 -s dipaco.phases=1 -s dipaco.inner_steps=2 -s train.steps=2
       -s train.batch_size=2 -s train.warmup_steps=1 -s train.eval_batches=1"
# shellcheck disable=SC2086
expect_ok "$O" init -c "$ROOT/configs/dipaco-2x2.yaml" -s model.n_embd=32 -s model.n_head=2 \
	-s model.seq_len=32 $small run
expect_ok "$S" split -q --random 4 out/train.tok run/shards
make -s -C run -j2 >/dev/null 2>make.err || { cat make.err; die "make of the spm run failed"; }
for f in run/phase-0001/paths/path-000.safetensors run/phase-0001/modules/lower.0.safetensors; do
	[ "$(meta $f tokenizer)" = "$want" ] || die "$f records '$(meta $f tokenizer)'"
done
[ "$(meta run/phase-0000/modules/lower.0.safetensors tokenizer)" = - ] ||
	die "a seeded module records a tokenizer"
# the outer step folds paths of one tokenizer only: path 1 said to be of BPE tokens
p1=run/phase-0001/paths/path-001.safetensors
"$PY" "$TESTDIR/stedit.py" $p1 p1.bpe meta tokenizer "$bpe_id"
cp $p1 p1.good
cp p1.bpe $p1
mv run/phase-0001/modules/lower.0.safetensors lower.0.good
expect_fail 1 "path-00[01].safetensors': trained on tokens of tokenizer spm-[0-9a-f]*, the run's other files on spm-" \
	"$O" step run --phase 1 --module lower.0 -q
[ ! -e run/phase-0001/modules/lower.0.safetensors ] || die "a refused outer step wrote its module"
cp p1.good $p1
# shellcheck disable=SC2086
expect_ok "$O" init -c "$ROOT/configs/dense.yaml" -s model.n_layer=2 -s model.n_embd=32 \
	-s model.n_head=2 -s model.seq_len=32 $small --from spm.st fork
[ "$(meta fork/phase-0000/modules/all.0.safetensors tokenizer)" = "$want" ] ||
	die "a module forked from spm.st records '$(meta fork/phase-0000/modules/all.0.safetensors tokenizer)'"
expect_ok "$S" split -q --random 1 bpe/train.tok fork/shards
expect_fail 2 "shard-000.tok': tokens of tokenizer $bpe_id, the model was trained on tokens of $want" \
	"$T" -q --run fork --phase 1 --path 0

# ---- export: the tokenizer beside the model files --------------------------------------------
expect_ok "$T" --export spm.st -o hf --tokenizer spm:m.model
for f in model.safetensors config.json tokenizer.json tokenizer_config.json tokenizer.model; do
	grep -q "\"$f\"" out.stdout || die "export does not list $f: $(cat out.stdout)"
done
same_file hf/tokenizer.model m.model
# tokenizer.json's pieces, ids and scores are SentencePiece's own (its Python module)
cat >hfcheck.py <<'END'
import json, sys
d, model, kind = sys.argv[1:4]
tj = json.load(open(d + "/tokenizer.json"))
tc = json.load(open(d + "/tokenizer_config.json"))
assert tc["model_max_length"] == 32 and tc["tokenizer_class"] == "PreTrainedTokenizerFast", tc
m = tj["model"]
assert m["type"] == kind and m["byte_fallback"] is True, (m["type"], kind)
assert tj["normalizer"] is None and tj["pre_tokenizer"]["type"] == "Metaspace"
try:
    import sentencepiece
except ImportError:
    sys.exit(0)
sp = sentencepiece.SentencePieceProcessor(model_file=model)
V = sp.get_piece_size()
if kind == "Unigram":
    assert len(m["vocab"]) == V and m["unk_id"] == sp.unk_id()
    for i, (p, s) in enumerate(m["vocab"]):
        assert p == sp.id_to_piece(i), (i, p)
        assert abs(s - sp.get_score(i)) <= 1e-6 * max(1.0, abs(s)), (i, p, s, sp.get_score(i))
else:
    assert m["vocab"] == {sp.id_to_piece(i): i for i in range(V)}
    for mg in m["merges"]:
        a, b = mg.split(" ")
        assert a + b in m["vocab"], mg
special = {t["id"] for t in tj["added_tokens"]}
assert special == {i for i in range(V) if sp.is_control(i) or sp.is_unknown(i)}, special
END
"$PY" hfcheck.py hf m.model Unigram || die "hf/tokenizer.json is not m.model"
# bytes: GPT-2's ByteLevel alphabet, byte b -> id b (the table computed here as GPT-2 does)
expect_ok "$T" --export byte.st -o hfb
"$PY" - <<'END' || die "hfb/tokenizer.json is not the byte tokenizer"
import json
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
want = {chr(c): b for b, c in zip(bs, cs)}
tj = json.load(open("hfb/tokenizer.json"))
assert tj["model"]["vocab"] == want and tj["model"]["merges"] == []
assert tj["pre_tokenizer"]["type"] == "ByteLevel" and tj["decoder"]["type"] == "ByteLevel"
END
# a BPE model's merges: pairs of pieces that make a piece
expect_ok "$T" -q -c "$cfg" -s model.vocab_size=300 -s train.steps=5 -d bpe/train.tok -o bpe.st
expect_ok "$T" --export bpe.st -o hfbpe --tokenizer spm:bpe.model
"$PY" hfcheck.py hfbpe bpe.model BPE || die "hfbpe/tokenizer.json is not bpe.model"
# Hugging Face's own tokenizer code, where it is at hand (HF_TOKENIZERS_JS: the directory of
# the @huggingface/tokenizers package; and node): the ids of spm_encode, and the text back
if [ -n "${HF_TOKENIZERS_JS:-}" ] && command -v node >/dev/null; then
	node "$TESTDIR/hftok.mjs" hf "$HF_TOKENIZERS_JS" lines.txt spm.ids ||
		die "tokenizers.js and SentencePiece disagree (unigram)"
	spm_encode --model=bpe.model --output_format=id <lines.txt >bpe.ids
	node "$TESTDIR/hftok.mjs" hfbpe "$HF_TOKENIZERS_JS" lines.txt bpe.ids ||
		die "tokenizers.js and SentencePiece disagree (BPE)"
	"$PY" -c 'import sys
for l in open("lines.txt", "rb"):
    print(" ".join(str(b) for b in l.rstrip(b"\n")))' >byte.ids
	node "$TESTDIR/hftok.mjs" hfb "$HF_TOKENIZERS_JS" lines.txt byte.ids ||
		die "tokenizers.js and the byte tokenizer disagree"
else
	echo "tokenizers.js not checked: set HF_TOKENIZERS_JS to the @huggingface/tokenizers package"
fi
# refusals: no tokenizer for a SentencePiece model, another one; nothing written
expect_fail 2 "spm.st': made with tokenizer $want, a vocabulary of 300: give its model with --tokenizer spm:MODEL$" \
	"$T" --export spm.st -o hf2
expect_fail 2 "spm.st': tokenizer $want, not the one given \(spm:bpe.model, which is $bpe_id\)" \
	"$T" --export spm.st -o hf2 --tokenizer spm:bpe.model
[ ! -e hf2 ] || die "a refused export wrote hf2"
expect_fail 1 "hf/model.safetensors': exists \(use --force" \
	"$T" --export spm.st -o hf --tokenizer spm:m.model
rm hf/model.safetensors hf/config.json
expect_fail 1 "hf/tokenizer.json': exists \(use --force" \
	"$T" --export spm.st -o hf --tokenizer spm:m.model
[ ! -e hf/model.safetensors ] || die "a refused export wrote hf/model.safetensors"
expect_fail 2 "--tokenizer goes with --export" \
	"$T" -q -c "$cfg" -d out/train.tok -o z.st --tokenizer byte

echo "tokenizer: SentencePiece training, prepare, cat, train, eval, features, sample, a DiPaCo run and the export agree with spm_encode and refuse other tokenizers"
