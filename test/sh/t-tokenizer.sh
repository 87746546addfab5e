#!/bin/sh
# t-tokenizer.sh - SentencePiece tokens end to end in dpc-shard: `tokenizer train` (the model's
# id against zlib's checksums of its bytes, the same file twice), `prepare --tokenizer
# spm:MODEL` (every document's tokens against spm_encode, SentencePiece's own command, and
# against its Python module where python3-sentencepiece is installed), `cat` decoding back to
# the source text, and the refusals: another tokenizer at cat, no model, a file that is no
# model, bad options, an existing model. Skipped in a build without SentencePiece.
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
expect_fail 2 "out/val.tok': tokens of tokenizer $want, not of the one given \(byte\)" \
	"$S" cat --tokenizer byte out/val.tok
expect_fail 2 "tokens of the tokenizer $want with a vocabulary of 300: give the model" \
	"$S" cat out/val.tok
expect_ok "$S" tokenizer train -q -o bpe.model --type bpe --vocab 300 in.jsonl
expect_fail 2 "tokens of tokenizer $want, not of the one given \(spm:bpe.model, which is spm-" \
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
echo "tokenizer: SentencePiece training, prepare, cat and refusals agree with spm_encode"
