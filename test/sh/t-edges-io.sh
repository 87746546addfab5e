# t-edges-io.sh - files at the edges (issue 11): outputs that are devices or FIFOs are written
# to, never replaced; a FIFO as an input that must be a regular file is refused at once, and
# one that is a stream (a config, a JSON Lines corpus) is read to its end; token-file metadata
# must be JSON objects (or empty); an empty corpus or an empty config is an error, not an empty
# dataset or a default run. The sections are numbered as the items of the issue; a killed
# writer (item 8) and a full disk under the metrics (item 7) are unit tests (test_atomicio,
# test_metrics). The device cases need root (mknod), the metadata cases python3; without them
# those alone are left out, the rest runs, and the test then exits 77.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
root=$(cd "$TESTDIR/../.." && pwd)
S=$BIN/dpc-shard
T=$BIN/dpc-train-path
PY=/usr/bin/python3
make_corpus c.jsonl 20
expect_ok "$S" prepare --val-frac 0 --router-frac 0 c.jsonl d
cp "$root/configs/gpt-tiny.yaml" tiny.yaml
tiny="-c tiny.yaml -s model.n_layer=1 -s model.n_embd=8 -s model.n_head=1 -s model.seq_len=8
      -s train.batch_size=1 -s train.steps=2 -s train.eval_every=0 -q -t 1"
# shellcheck disable=SC2086
expect_ok "$T" $tiny -d d/train.tok -o good.safetensors
notes=""

# --- 1: an output that is not a regular file is written to, not replaced --------------------
if [ "$(id -u)" = 0 ] && mknod -m 666 null c 1 3 2>/dev/null; then
	ln -s null null-link
	expect_ok "$T" $tiny -d d/train.tok -o null
	[ "$(stat -c %F null)" = "character special file" ] || die "-o null: now $(stat -c %F null)"
	expect_ok "$T" $tiny -d d/train.tok -o null-link
	[ -L null-link ] && [ "$(stat -L -c %F null-link)" = "character special file" ] ||
		die "-o null-link: the link or the device was replaced"
	# a full device: the error names the output, and the device stays
	mknod -m 666 full c 1 7
	expect_fail 1 "^dpc-train-path: 'full': .*space" "$T" $tiny -d d/train.tok -o full
	[ "$(stat -c %F full)" = "character special file" ] || die "-o full: now $(stat -c %F full)"
	ls | grep -q '\.tmp\.' && die "temporary files left: $(ls | grep '\.tmp\.')"
else
	notes="$notes; device outputs (needs root and mknod)"
fi
# a FIFO with a reader gets the whole checkpoint; the FIFO stays a FIFO
mkfifo out.fifo
cat out.fifo >got.safetensors &
reader=$!
timeout 60 "$T" $tiny -d d/train.tok -o out.fifo >out.stdout 2>out.stderr && rc=0 || rc=$?
if [ $rc != 0 ] || [ ! -p out.fifo ]; then
	kill $reader 2>/dev/null || : # it may wait forever on a FIFO nobody opens any more
	cat out.stderr
	die "-o out.fifo: exit $rc, out.fifo is now a $(stat -c %F out.fifo)"
fi
wait $reader || die "the reader of out.fifo failed"
same_file got.safetensors good.safetensors
# a symlink to a regular file is followed: the file is replaced, the link stays
echo old >target.safetensors
ln -s target.safetensors link.safetensors
expect_ok "$T" $tiny -d d/train.tok -o link.safetensors --force
[ -L link.safetensors ] || die "the link was replaced by a file"
same_file target.safetensors good.safetensors

# --- 2: FIFOs as inputs ---------------------------------------------------------------------
# token files and checkpoints must be regular files: refused at once, not waited on
mkfifo in.fifo
expect_fail 1 "^dpc-shard: 'in.fifo': is a FIFO, not a regular file$" timeout 10 "$S" info in.fifo
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$S" split --random 2 in.fifo sp
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$T" $tiny -d in.fifo -o o.safetensors
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$T" $tiny -d d/train.tok -v in.fifo -o o.safetensors
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$T" $tiny -d d/train.tok -i in.fifo -o o.safetensors
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$T" --eval in.fifo -d d/train.tok
expect_fail 1 "'in.fifo': is a FIFO, not a regular file$" \
	timeout 10 "$T" --eval good.safetensors -d in.fifo
[ ! -e o.safetensors ] || die "a refused run wrote o.safetensors"
# a config and a JSON Lines corpus are streams: from a FIFO with a writer they are read whole
# (a writer left waiting by a failed check is killed on the way out)
cat tiny.yaml >in.fifo &
writer=$!
trap 'kill $writer 2>/dev/null || :' EXIT
expect_ok timeout 60 "$T" $(echo "$tiny" | sed 's/-c tiny.yaml/-c in.fifo/') -d d/train.tok \
	-o fromfifo.safetensors
same_file fromfifo.safetensors good.safetensors
cat c.jsonl >in.fifo &
writer=$!
expect_ok timeout 60 "$S" prepare --val-frac 0 --router-frac 0 in.fifo dfifo
same_file dfifo/train.tok d/train.tok
trap - EXIT
# in a directory of documents only regular files count: a FIFO there is passed over
mkdir docs
echo "one document" >docs/a.txt
mkfifo docs/b.fifo
expect_ok timeout 10 "$S" prepare --val-frac 0 --router-frac 0 docs ddocs
grep -q '^  "docs": 1,$' out.stdout || die "documents of docs: $(cat out.stdout)"

# --- 4: token-file metadata must be NUL-free JSON objects -----------------------------------
if [ -x "$PY" ]; then
	# a JSON object, or nothing (a document without metadata), and nothing else
	for meta in '{"id":1}' '' '{"a":"x\0y"}' 'not json' '[1,2]' '{"id":1} x' '{"a":1,"a":2}'; do
		"$PY" - "$meta" m.tok <<'EOF' || die "cannot write m.tok"
import struct, sys, zlib
meta = sys.argv[1].encode().replace(b"\\0", b"\0")
toks = struct.pack("<3H", 1, 2, 3)
body = toks + bytes(-len(toks) % 8) + struct.pack("<4Q", 0, 3, 0, len(meta)) + meta
hdr = struct.pack("<8sIIQQIIQ12x", b"DPCTOKS\0", 1, 256, 1, 3, 2, zlib.crc32(body), len(meta))
open(sys.argv[2], "wb").write(hdr + struct.pack("<I", zlib.crc32(hdr)) + body)
EOF
		if [ "$meta" = '{"id":1}' ] || [ -z "$meta" ]; then
			expect_ok "$S" info m.tok
		else
			expect_fail 1 "^dpc-shard: 'm.tok': metadata of document 0 " "$S" info m.tok
		fi
	done
else
	notes="$notes; token-file metadata (needs $PY)"
fi

# --- 10: nothing in, nothing made ------------------------------------------------------------
mkdir empty
: >empty.jsonl
printf '\n  \n' >blank.jsonl
for in in empty /dev/null empty.jsonl blank.jsonl; do
	expect_fail 1 "^dpc-shard: '$in': holds no documents$" "$S" prepare "$in" e
	[ ! -e e ] || die "prepare of '$in' left e"
done
: >empty.yaml
printf '# only a comment\n' >comment.yaml
printf '{}\n' >mapping.yaml
none="holds no settings \\(name at least one key\\)"
for c in /dev/null empty.yaml comment.yaml mapping.yaml; do
	expect_fail 2 "^dpc-train-path: '$c': $none\$" \
		timeout 60 "$T" -q -c "$c" -d d/train.tok -o e.safetensors
done
[ ! -e e.safetensors ] || die "a run on an empty config wrote e.safetensors"
[ -z "$notes" ] || skip "left out${notes}"
