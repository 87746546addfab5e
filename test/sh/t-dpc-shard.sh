#!/bin/sh
# t-dpc-shard.sh - dpc-shard prepare and info: outputs, token counts against byte counts
# measured with wc, refusal to overwrite, --force, malformed input, damaged token files,
# usage errors, and --help agreeing with the man page.
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
[ ! -e o3 ] || die "o3 created by a usage error"
expect_ok "$S" --help
grep -q '^usage: dpc-shard' out.stdout || die "--help: $(cat out.stdout)"
expect_ok "$S" -V
grep -q '^dpc-shard [0-9]' out.stdout || die "-V: $(cat out.stdout)"

# --- every option of every subcommand's --help is in the man page
[ -f "$MAN" ] || die "man page '$MAN' missing"
for c in prepare info; do
	expect_ok "$S" $c --help
	for o in $(grep -o -- '--[a-z][a-z-]*' out.stdout | sort -u); do
		esc=$(printf '%s' "$o" | sed 's/-/\\\\-/g')
		grep -q -- "$esc" "$MAN" || die "option $o of '$c --help' is not in dpc-shard.1"
	done
done
echo "all dpc-shard checks passed"
