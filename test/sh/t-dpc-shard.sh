#!/bin/sh
# t-dpc-shard.sh - dpc-shard prepare, info and split: outputs, token counts against byte
# counts measured with wc, refusal to overwrite, --force, malformed input, --chunk against the
# unchunked output (and a Python reading of the token files), empty splits refused, plain
# text (.txt, or refused as not JSON Lines), damaged token files, the shards of a split against
# its manifest and its input, usage errors, and --help agreeing with the man page. (Which
# document goes to which shard is checked in test_shardsplit.c.)
set -eu
. "$TESTDIR/lib.sh"
S=$BIN/dpc-shard
MAN=$TESTDIR/../../man/dpc-shard.1

# A small corpus. The JSON escapes decode to the raw texts written beside them, whose bytes
# wc counts independently.
cat >in.jsonl <<'END'
{"text":"The quick brown fox.","id":1}
{"text":"caf\u00e9 \"quoted\" back\\slash","id":2,"tags":["a","b"]}

{"text":"two\nlines","id":3}
{"text":"","id":4}
{"text":"na\u00efve \ud83d\ude00","id":5}
END
printf '%s' 'The quick brown fox.' >raw.1
printf '%s' 'café "quoted" back\slash' >raw.2
printf 'two\nlines' >raw.3
: >raw.4
printf '%s' 'naïve 😀' >raw.5
want_tokens=$(cat raw.1 raw.2 raw.3 raw.4 raw.5 | wc -c)
[ "$want_tokens" -eq 65 ] || die "test corpus has $want_tokens bytes, expected 65"

# field NAME FILE: a top-level integer field of dpc-shard's indented JSON output
field() { sed -n "s/^  \"$1\": \([0-9][0-9]*\),*\$/\1/p" "$2"; }

# --- prepare, all documents to train
expect_ok "$S" prepare --val-frac 0 --router-frac 0 in.jsonl out
cp out.stdout summary.json
for s in train val router; do [ -s "out/$s.tok" ] || die "out/$s.tok missing"; done
[ "$(field docs summary.json)" = 5 ] || die "summary docs: $(cat summary.json)"
[ "$(field source_docs summary.json)" = 5 ] || die "summary source_docs: $(cat summary.json)"
[ "$(field chunk summary.json)" = 0 ] || die "summary chunk: $(cat summary.json)"
[ "$(field tokens summary.json)" = "$want_tokens" ] || die "summary tokens: $(cat summary.json)"
expect_ok "$S" info out/train.tok
[ "$(field tokens out.stdout)" = "$want_tokens" ] || die "train tokens: $(cat out.stdout)"
[ "$(field docs out.stdout)" = 5 ] || die "train docs: $(cat out.stdout)"
[ "$(field vocab out.stdout)" = 256 ] || die "vocab: $(cat out.stdout)"
grep -q '"crc_ok": true' out.stdout || die "crc_ok missing: $(cat out.stdout)"
expect_ok "$S" info out/val.tok
[ "$(field docs out.stdout)" = 0 ] || die "val should be empty: $(cat out.stdout)"
ls -a out | grep -q tmp && die "temporary files left in out/: $(ls -a out)"

# --- refuse to overwrite; the old files stay as they were
cp out/train.tok keep.tok
expect_fail 1 "'out/train.tok'.*exists.*--force" "$S" prepare in.jsonl out
same_file out/train.tok keep.tok

# --- --force replaces; with half the documents held out, the splits still add up
expect_ok "$S" prepare --force --val-frac 0.3 --router-frac 0.3 --seed 7 in.jsonl out
docs=0 toks=0
for s in train val router; do
	expect_ok "$S" info "out/$s.tok"
	docs=$((docs + $(field docs out.stdout)))
	toks=$((toks + $(field tokens out.stdout)))
done
[ $docs = 5 ] && [ $toks = "$want_tokens" ] || die "splits hold $docs docs, $toks tokens"
cmp -s out/train.tok keep.tok && die "--force did not replace out/train.tok"

# --- same inputs and seed: identical files
expect_ok "$S" prepare --val-frac 0.3 --router-frac 0.3 --seed 7 in.jsonl again
for s in train val router; do same_file "out/$s.tok" "again/$s.tok"; done

# --- a directory of text files
mkdir docs
cp raw.1 docs/a; cp raw.2 docs/b; cp raw.5 docs/c
expect_ok "$S" prepare --val-frac 0 --router-frac 0 docs dout
expect_ok "$S" info dout/train.tok
[ "$(field tokens out.stdout)" = "$(cat docs/* | wc -c)" ] || die "dir tokens: $(cat out.stdout)"

# --- malformed JSONL: one line naming the file and line, no outputs at all
{ head -n 2 in.jsonl; echo '{"text": "unterminated'; } >bad.jsonl
expect_fail 1 "^dpc-shard: 'bad.jsonl': line 3" "$S" prepare bad.jsonl badout
[ ! -e badout ] || die "badout left behind: $(ls -a badout)"
expect_fail 1 "'bad.jsonl': line 3" "$S" prepare --force bad.jsonl out
for s in train val router; do same_file "out/$s.tok" "again/$s.tok"; done
[ "$(ls -A out | wc -l)" = 3 ] || die "extra files in out/: $(ls -A out)"
echo '{"id":1}' >notext.jsonl
expect_fail 1 "'notext.jsonl': line 1: no \"text\" field" "$S" prepare notext.jsonl o2
expect_fail 1 "'missing.jsonl': cannot open" "$S" prepare missing.jsonl o2

# --- --chunk: documents cut into pieces, each piece in the split of its document.
# 40 documents of 0 to 96 bytes, prepared whole and cut into pieces of 10 with the same seed.
awk 'BEGIN { for (i = 0; i < 40; i++) { s = ""; n = (i * 13) % 97
	for (j = 0; j < n; j++) s = s sprintf("%c", 97 + (i + j) % 26)
	printf "{\"id\":\"d%d\",\"text\":\"%s\",\"n\":%d}\n", i, s, n } }' >long.jsonl
expect_ok "$S" prepare --val-frac 0.2 --router-frac 0.2 --seed 4 long.jsonl whole
cp out.stdout whole.json
expect_ok "$S" prepare --chunk 10 --val-frac 0.2 --router-frac 0.2 --seed 4 long.jsonl cut
cp out.stdout cut.json
[ "$(field chunk cut.json)" = 10 ] || die "summary chunk: $(cat cut.json)"
[ "$(field source_docs cut.json)" = 40 ] || die "summary source_docs: $(cat cut.json)"
[ "$(field tokens cut.json)" = "$(field tokens whole.json)" ] || die "tokens differ: $(cat cut.json)"
[ "$(field docs cut.json)" -gt 100 ] || die "too few pieces: $(cat cut.json)"
for s in train val router; do
	expect_ok "$S" info "cut/$s.tok"
	t=$(field tokens out.stdout)
	expect_ok "$S" info "whole/$s.tok"
	[ "$t" = "$(field tokens out.stdout)" ] || die "$s: $t tokens cut, $(cat out.stdout)"
done
if [ -x /usr/bin/python3 ]; then
	# Read the token files as dpc-tokens(5) describes them and check the pieces against
	# the whole documents with the rule of dpc-shard(1), written again here.
	/usr/bin/python3 - whole.json cut.json <<'EOF' || die "the pieces of --chunk do not match the whole documents"
import json, struct, sys
N = 10
def read(path):
    b = open(path, "rb").read()
    assert b[:8] == b"DPCTOKS\0", path
    ndocs, ntok = struct.unpack_from("<QQ", b, 16)
    width, = struct.unpack_from("<I", b, 32)
    mbytes, = struct.unpack_from("<Q", b, 40)
    p = 64
    toks = struct.unpack_from("<%d%s" % (ntok, "H" if width == 2 else "I"), b, p)
    p += (ntok * width + 7) // 8 * 8
    offs = struct.unpack_from("<%dQ" % (ndocs + 1), b, p)
    moffs = struct.unpack_from("<%dQ" % (ndocs + 1), b, p + 8 * (ndocs + 1))
    meta = b[p + 16 * (ndocs + 1):]
    assert len(meta) == mbytes, path
    docs = []
    for i in range(ndocs):
        m = meta[moffs[i]:moffs[i + 1]]
        keys = json.loads(m, object_pairs_hook=lambda kv: [k for k, _ in kv])
        docs.append((list(toks[offs[i]:offs[i + 1]]), json.loads(m), keys))
    return docs
def lengths(n):
    # N tokens a piece; a remainder of at least N/2 is a piece of its own, a shorter one
    # joins the piece before; a document shorter than N stays whole
    if n < N:
        return [n]
    k, r = divmod(n, N)
    ls = [N] * k
    if 2 * r >= N:
        ls.append(r)
    else:
        ls[-1] += r
    return ls
whole, cut = (json.load(open(f)) for f in sys.argv[1:3])
split_of = {}
for s in ("train", "val", "router"):
    w, c = read("whole/%s.tok" % s), read("cut/%s.tok" % s)
    assert len(w) > 0, "%s: empty, the test needs all three splits" % s
    assert whole[s]["docs"] == whole[s]["source_docs"] == len(w), (s, whole[s])
    assert cut[s]["source_docs"] == len(w) and cut[s]["docs"] == len(c), (s, cut[s])
    for toks, meta, keys in c:
        d = meta["doc"]
        assert split_of.setdefault(d, s) == s, "doc %d in %s and %s" % (d, split_of[d], s)
    i = 0
    for toks, meta, keys in w:
        d = int(meta["id"][1:])
        assert meta["n"] == len(toks), meta
        got = []
        for k, want in enumerate(lengths(len(toks))):
            ptoks, pmeta, pkeys = c[i]
            i += 1
            assert len(ptoks) == want, (d, k, len(ptoks), want)
            assert pmeta == dict(meta, doc=d, chunk=k), (pmeta, meta)
            assert pkeys == keys + ["doc", "chunk"], pkeys
            got += ptoks
        assert got == toks, "doc %d: the pieces are not the document" % d
    assert i == len(c), "%s: %d pieces left over" % (s, len(c) - i)
assert sorted(split_of) == list(range(40)), sorted(split_of)
EOF
else
	echo "python3 missing: the pieces of --chunk not checked against the whole documents"
fi

# --- a split asked for that gets no document: one line, exit 1, nothing written
echo '{"text":"only one document","id":1}' >one.jsonl
expect_fail 1 "^dpc-shard: 'one.jsonl': val and router splits are empty: the input has 1 document and none went to them \(--val-frac 0.02, --router-frac 0.005\); use more documents or larger fractions, or 0 for no such split" \
	"$S" prepare one.jsonl oneout
[ ! -e oneout ] || die "oneout/ created by a refused prepare"
expect_fail 1 "^dpc-shard: 'one.jsonl': val split is empty: the input has 1 document and none went to it \(--val-frac 0.02\); use more documents or a larger --val-frac, or --val-frac 0 for no val split" \
	"$S" prepare --router-frac 0 --chunk 4 one.jsonl oneout
expect_fail 1 "^dpc-shard: 'one.jsonl': router split is empty: .*\(--router-frac 0.005\)" \
	"$S" prepare --val-frac 0 one.jsonl oneout
[ ! -e oneout ] || die "oneout/ created by a refused prepare"
# existing outputs stay as they were, with --force too
expect_fail 1 "'one.jsonl': val and router splits are empty" "$S" prepare --force one.jsonl out
for s in train val router; do same_file "out/$s.tok" "again/$s.tok"; done
[ "$(ls -A out | wc -l)" = 3 ] || die "extra files in out/: $(ls -A out)"
# a fraction of 0 asks for no such split: no error ("only one document": 17 bytes, 4 pieces)
expect_ok "$S" prepare --val-frac 0 --router-frac 0 --chunk 4 one.jsonl oneout
[ "$(field docs out.stdout)" = 4 ] && [ "$(field source_docs out.stdout)" = 1 ] ||
	die "one.jsonl in pieces of 4: $(cat out.stdout)"

# --- plain text: a .txt file is one document; another file that is not JSON Lines says so
printf 'Plain text,\nnot JSON at all.\n' >story.txt
[ "$(wc -c <story.txt)" -eq 29 ] || die "story.txt has $(wc -c <story.txt) bytes, expected 29"
expect_fail 1 "'story.txt': val and router splits are empty: the input has 1 document" \
	"$S" prepare story.txt tout
expect_ok "$S" prepare --val-frac 0 --router-frac 0 --chunk 8 story.txt tout
[ "$(field source_docs out.stdout)" = 1 ] && [ "$(field docs out.stdout)" = 4 ] &&
	[ "$(field tokens out.stdout)" = 29 ] || die "story.txt in pieces of 8: $(cat out.stdout)"
grep -q '{"file":"story.txt","doc":0,"chunk":3}$' tout/train.tok ||
	die "piece metadata missing from tout/train.tok"
cp story.txt story.md
expect_fail 1 "^dpc-shard: 'story.md': not JSON Lines \(one \{\"text\": \.\.\.\} object per line\); for plain text name the file \*\.txt or pass a directory of text files$" \
	"$S" prepare --val-frac 0 --router-frac 0 story.md sout
[ ! -e sout ] || die "sout/ created for a file that is not JSON Lines"

# --- damaged token files
n=$(wc -c <out/train.tok)
head -c $((n - 3)) out/train.tok >trunc.tok
expect_fail 1 "'trunc.tok': truncated file: [0-9]+ bytes, header says" "$S" info trunc.tok
head -c 20 out/train.tok >short.tok
expect_fail 1 "'short.tok': .*shorter than the 64-byte header" "$S" info short.tok
cp out/train.tok flip.tok
b=$(od -An -tu1 -j70 -N1 flip.tok | tr -d ' ')
printf "\\$(printf %o $(((b + 1) % 256)))" | dd of=flip.tok bs=1 seek=70 conv=notrunc 2>/dev/null
expect_fail 1 "'flip.tok': body checksum mismatch" "$S" info flip.tok
expect_fail 1 "'in.jsonl': not a token file" "$S" info in.jsonl
if [ -w /dev/full ]; then
	expect_fail 1 "^dpc-shard: '<stdout>': write failed" sh -c '"$0" info out/train.tok >/dev/full' "$S"
fi

# --- split: 40 documents of distinct lengths into shards
i=1
while [ $i -le 40 ]; do
	printf '{"text":"document %d %*s","n":%d}\n' $i $i '' $i
	i=$((i + 1))
done >many.jsonl
expect_ok "$S" prepare --val-frac 0 --router-frac 0 many.jsonl sp
expect_ok "$S" info sp/train.tok
src_tokens=$(field tokens out.stdout)
src_crc=$(sed -n 's/^  "crc32": "\([0-9a-f]*\)",*$/\1/p' out.stdout)
[ "$(field docs out.stdout)" = 40 ] || die "many.jsonl: $(cat out.stdout)"

expect_ok "$S" split --random 3 --seed 5 sp/train.tok shards
[ "$(wc -l <out.stdout)" = 1 ] || die "split stdout is not one line: $(cat out.stdout)"
[ ! -s out.stderr ] || die "split wrote to stderr (not a terminal): $(cat out.stderr)"
cp out.stdout split.json
[ "$(ls shards)" = "$(printf 'shard-000.tok\nshard-001.tok\nshard-002.tok\nshards.json')" ] ||
	die "shards/ holds: $(ls -a shards)"
# The manifest's shard counts against each shard file as info reads it, and their sums
# against the input.
docs=0 toks=0 n=0
for f in shards/shard-00?.tok; do
	expect_ok "$S" info "$f"
	d=$(field docs out.stdout) t=$(field tokens out.stdout)
	b=$(basename "$f")
	grep -q "{\"file\": \"$b\", \"docs\": $d, \"tokens\": $t}" split.json ||
		die "$b holds $d docs, $t tokens; manifest: $(cat split.json)"
	[ "$d" -gt 0 ] || die "$b is empty"
	docs=$((docs + d)) toks=$((toks + t)) n=$((n + 1))
done
[ $n = 3 ] && [ $docs = 40 ] && [ $toks = "$src_tokens" ] ||
	die "$n shards hold $docs docs, $toks tokens (input: 40, $src_tokens)"
grep -q "^{\"source\": \"sp/train.tok\", \"source_crc\": \"$src_crc\", \"method\": \"random\", \"seed\": 5, \"paths\": 3, \"shards\": \[" split.json ||
	die "manifest head: $(cat split.json)"
if [ -x /usr/bin/python3 ]; then
	# stdout parses as JSON and is the object of shards.json
	/usr/bin/python3 -c '
import json, sys
a = json.load(open(sys.argv[1]))
b = json.load(open(sys.argv[2]))
assert a == b, (a, b)
assert sum(s["docs"] for s in a["shards"]) == 40
' split.json shards/shards.json || die "stdout and shards.json disagree or do not parse"
else
	echo "python3 missing: JSON parse of the split summary not run"
fi
ls -a shards | grep -q tmp && die "temporary files left in shards/: $(ls -a shards)"

# the same seed gives the same files; -q changes nothing but the progress line
expect_ok "$S" split -q --random 3 --seed 5 sp/train.tok shards2
for f in shard-000.tok shard-001.tok shard-002.tok; do same_file "shards/$f" "shards2/$f"; done

# one shard is a copy of the input
expect_ok "$S" split --random 1 sp/train.tok one
same_file sp/train.tok one/shard-000.tok

# an existing split is refused without --force, whatever P, and left as it was
cp -r shards keep
expect_fail 1 "^dpc-shard: 'shards/shard-000.tok': exists \(use --force to replace it\)$" \
	"$S" split --random 3 --seed 6 sp/train.tok shards
expect_fail 1 "'shards/shard-000.tok': exists" "$S" split --random 2 sp/train.tok shards
mkdir lone && : >lone/shards.json
expect_fail 1 "'lone/shards.json': exists" "$S" split --random 2 sp/train.tok lone
for f in shard-000.tok shard-001.tok shard-002.tok shards.json; do
	same_file "shards/$f" "keep/$f"
done
# with --force the new split replaces the old one, shard-002.tok of the old one included
expect_ok "$S" split --force --random 2 --seed 6 sp/train.tok shards
[ "$(ls shards)" = "$(printf 'shard-000.tok\nshard-001.tok\nshards.json')" ] ||
	die "after --force shards/ holds: $(ls shards)"
grep -q '"paths": 2' shards/shards.json || die "shards.json not replaced: $(cat shards/shards.json)"

# more than 1000 shards: four-digit names
awk 'BEGIN { for (i = 0; i < 12000; i++) printf "{\"text\":\"d%d\"}\n", i }' >wide.jsonl
expect_ok "$S" prepare --val-frac 0 --router-frac 0 wide.jsonl wsp
expect_ok "$S" split -q --random 1001 wsp/train.tok wide
[ -f wide/shard-0000.tok ] && [ -f wide/shard-1000.tok ] && [ ! -e wide/shard-000.tok ] ||
	die "1001 shards: $(ls wide | head -n 3) ... $(ls wide | tail -n 2)"
[ "$(ls wide | grep -c '^shard-[0-9][0-9][0-9][0-9]\.tok$')" = 1001 ] || die "not 1001 shard files"

# refusals that write nothing: empty shards, missing or bad input, an OUTDIR that is a file
expect_fail 1 "^dpc-shard: 'sp/train.tok': shard [0-9]+ of 50 would be empty: the file has only 40 documents$" \
	"$S" split --random 50 sp/train.tok none
[ ! -e none ] || die "none/ created by a refused split"
expect_fail 1 "'missing.tok': cannot open" "$S" split --random 2 missing.tok none
expect_fail 1 "'in.jsonl': not a token file" "$S" split --random 2 in.jsonl none
[ ! -e none ] || die "none/ created by a failed split"
expect_fail 1 "'in.jsonl'" "$S" split --random 2 sp/train.tok in.jsonl

# usage errors: one line, exit 2, nothing created
expect_fail 2 "^dpc-shard: split: give --random P or --router FILE \(one of them; see dpc-shard split --help\)$" \
	"$S" split sp/train.tok none
expect_fail 2 "option '--random': 0 is outside \[1, 65536\]" "$S" split --random 0 sp/train.tok none
expect_fail 2 "option '--random': 65537 is outside" "$S" split --random 65537 sp/train.tok none
expect_fail 2 "option '--random': 'x' is not an integer" "$S" split --random x sp/train.tok none
expect_fail 2 "option '--seed': -1 is outside" "$S" split --random 2 --seed -1 sp/train.tok none
expect_fail 2 "option '--random' requires an argument" "$S" split sp/train.tok none --random
expect_fail 2 "expected IN.tok and OUTDIR, got 1 argument " "$S" split --random 2 sp/train.tok
expect_fail 2 "expected IN.tok and OUTDIR, got 3 arguments" "$S" split --random 2 a b c
expect_fail 2 "unknown option '--top2' \(did you mean '--top'\? see dpc-shard split --help\)" "$S" split --top2 --random 2 sp/train.tok none
expect_fail 2 "option '--quiet' takes no argument" "$S" split --quiet=1 --random 2 sp/train.tok none
[ ! -e none ] || die "none/ created by a usage error"
expect_ok "$S" split --help
for o in --random --seed --force -q --quiet --help --version; do
	grep -q -- "$o" out.stdout || die "split --help does not list $o: $(cat out.stdout)"
done
expect_ok "$S" --help
grep -q '^  split ' out.stdout || die "--help does not list split: $(cat out.stdout)"

# --- usage
expect_fail 2 "^dpc-shard: unknown command 'frobnicate' \(see dpc-shard --help\)$" "$S" frobnicate
expect_fail 2 "missing command" "$S"
expect_fail 2 "unknown option '--bogus'" "$S" prepare --bogus in.jsonl o3
expect_fail 2 "^dpc-shard: option '--force' takes no argument \(see dpc-shard prepare --help\)$" \
	"$S" prepare --force=1 in.jsonl o3
expect_fail 2 "'--val-frac'" "$S" prepare --val-frac 2 in.jsonl o3
expect_fail 2 "add up to" "$S" prepare --val-frac 0.6 --router-frac 0.6 in.jsonl o3
expect_fail 2 "expected INPUT and OUTDIR" "$S" prepare in.jsonl
expect_fail 2 "unknown tokenizer 'bpe'" "$S" prepare --tokenizer bpe in.jsonl o3
expect_fail 2 "^dpc-shard: option '--chunk': pieces of 1 token; N must be 2 or more, or 0 for no cutting \(see dpc-shard prepare --help\)$" \
	"$S" prepare --chunk 1 in.jsonl o3
expect_fail 2 "option '--chunk': -1 is outside" "$S" prepare --chunk -1 in.jsonl o3
expect_fail 2 "option '--chunk': '8k' is not an integer" "$S" prepare --chunk 8k in.jsonl o3
[ ! -e o3 ] || die "o3 created by a usage error"
expect_ok "$S" --help
grep -q '^usage: dpc-shard' out.stdout || die "--help: $(cat out.stdout)"
expect_ok "$S" -V
grep -q '^dpc-shard [0-9]' out.stdout || die "-V: $(cat out.stdout)"

# --- every option of every subcommand's --help is in the man page
[ -f "$MAN" ] || die "man page '$MAN' missing"
for c in prepare info split; do
	expect_ok "$S" $c --help
	for o in $(grep -o -- '--[a-z][a-z-]*' out.stdout | sort -u); do
		esc=$(printf '%s' "$o" | sed 's/-/\\\\-/g')
		grep -q -- "$esc" "$MAN" || die "option $o of '$c --help' is not in dpc-shard.1"
	done
done
echo "all dpc-shard checks passed"
