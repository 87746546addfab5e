#!/bin/sh
# Messages at the edges (issue 11): an error quoting a value with a newline in it stays one
# stderr line (control characters escaped); a trace with a NUL byte or an out-of-range value
# is refused naming the file and the line, and a trace from a pipe is read as a stream; a
# dense baseline that cannot fit is refused before anything runs or prints; a number with
# white space around it is refused by every numeric option of every program.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
root=$TESTDIR/../..
T=$BIN/dpc-train-path
M=$BIN/moe-bench
PY=/usr/bin/python3
nl='
'
make_corpus c.jsonl 30
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
tiny="-q -t 1 -c $root/configs/gpt-tiny.yaml -d d/train.tok -o out.safetensors"

# ---- 3. one line whatever the message quotes ---------------------------------------------
# shellcheck disable=SC2086 # $tiny is a list of arguments
expect_fail 2 "^dpc-train-path: override 'train.lr=1\\\\nx': train.lr: '1\\\\nx' is not a number$" \
	"$T" $tiny -s "train.lr=1${nl}x"
printf 'train:\n  lr: "1\\nx"\n' >value.yaml
expect_fail 2 "^dpc-train-path: 'value.yaml': line 2: train.lr: \"1\\\\nx\" is a quoted string" \
	"$T" -q -c value.yaml -d d/train.tok -o out.safetensors
printf 'train:\n  "l\\nr": 1\n' >key.yaml
expect_fail 2 "^dpc-train-path: 'key.yaml': line 2: unknown key 'train.l\\\\nr'" \
	"$T" -q -c key.yaml -d d/train.tok -o out.safetensors
printf 'train:\n  lr: "\\t\\e[31m"\n' >ctl.yaml
expect_fail 2 "^dpc-train-path: 'ctl.yaml': line 2: train.lr: \"\\\\t\\\\x1b\\[31m\"" \
	"$T" -q -c ctl.yaml -d d/train.tok -o out.safetensors
# a file name with a newline, and an argument
expect_fail 1 "^dpc-train-path: 'no\\\\nsuch.yaml': [a-z ]+$" \
	"$T" -q -c "no${nl}such.yaml" -d d/train.tok -o out.safetensors
expect_fail 2 "^moe-bench: unexpected argument 'a\\\\nb'$" "$M" "a${nl}b"
if [ -x "$PY" ]; then
	"$PY" - <<'EOF'
import json, struct
h = json.dumps({"w": {"dtype": "F\n32", "shape": [1], "data_offsets": [0, 4]}}).encode()
open("dtype.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(4))
EOF
	expect_fail 1 "^dpc-train-path: 'dtype.safetensors': .*'F\\\\n32'" \
		"$T" --eval dtype.safetensors -d d/val.tok
else
	echo "the safetensors dtype case skipped: $PY missing"
fi

# ---- 5. traces ---------------------------------------------------------------------------
run="-T 8 -M 8 -H 8 -E 2 -k 1 -n 1 -w 0 -t 1"
printf '1.0\0 garbage\n' >nul.trace
# shellcheck disable=SC2086
expect_fail 2 "^moe-bench: 'nul.trace': line 1: NUL byte in the trace$" "$M" $run --trace=nul.trace
printf '1\n\0\n2\n' >nul2.trace
# shellcheck disable=SC2086
expect_fail 2 "^moe-bench: 'nul2.trace': line 2: NUL byte" "$M" $run --trace=nul2.trace
printf '1\n# big\n1e300\n' >big.trace
# shellcheck disable=SC2086
expect_fail 2 "^moe-bench: 'big.trace': line 3: capacity setting 1e\\+300 is outside \\[-1e\\+06, 1e\\+06\\]$" \
	"$M" $run --trace=big.trace
# a trace from a pipe, written in two pieces, is read to its end
mkfifo pipe.trace
{ printf '1\n'; sleep 1; printf '0.5\n'; } >pipe.trace &
# shellcheck disable=SC2086
expect_ok timeout 20 "$M" $run -n 2 --trace=pipe.trace
wait
grep -q '"trace":"pipe.trace"' out.stdout || die "no trace run: $(cat out.stdout)"
grep -q '"capacity_last":2,' out.stdout ||
	die "the second setting (0.5: C = 2) was not replayed: $(cat out.stdout)"

# ---- 6. every formulation is checked before any runs ---------------------------------------
# The dense [T,E,C] tensors at T = 10^6 take terabytes: refused before the sparse run prints.
expect_fail 1 "^moe-bench: the dense formulation needs [0-9.]+ GiB at T=1000000" \
	"$M" -n 1 -w 0 -T 1000000 -E 64 -k 2 -M 8 -H 8 -t 1 --baseline=dense
[ ! -s out.stdout ] || die "a refused run printed: $(cat out.stdout)"
expect_fail 1 "^moe-bench: the dense formulation needs" \
	"$M" -n 1 -w 0 -T 1000000 -E 64 -k 2 -M 8 -H 8 -t 1 --baseline=dense --only=encode-decode
[ ! -s out.stdout ] || die "a refused run printed: $(cat out.stdout)"
expect_ok "$M" -n 1 -w 0 -T 1000000 -E 64 -k 2 -M 8 -H 8 -t 1 --baseline=dense --dry-run

# ---- 9. white space around a number ------------------------------------------------------
for v in ' 5' '5 ' "${nl}5" '	5'; do
	# a tiny dry run, should a number get through
	small="-T 8 -M 4 -H 4 -E 2 -k 1 -n 1 -w 0 --dry-run"
	for o in -T -M -H -E -k --capacity-align --dense-tokens -n -w -s -t; do
		# shellcheck disable=SC2086
		expect_fail 2 "^moe-bench: option '-.*': '.*5.*' is not an integer$" \
			"$M" $small "$o" "$v"
	done
	for o in -c --gate-noise; do
		# shellcheck disable=SC2086
		expect_fail 2 "^moe-bench: option '-.*': '.*5.*' is not a number$" \
			"$M" $small "$o" "$v"
	done
	for o in -u -t -n --phase --path; do
		expect_fail 2 "^dpc-train-path: option '-.*': '.*5.*' is not an integer$" "$T" "$o" "$v"
	done
	expect_fail 2 "^dpc-shard: option '--val-frac': '.*5.*' is not a number$" \
		"$BIN/dpc-shard" prepare --val-frac "$v" c.jsonl x
	expect_fail 2 "^dpc-shard: option '--router-frac': '.*5.*' is not a number$" \
		"$BIN/dpc-shard" prepare --router-frac "$v" c.jsonl x
	expect_fail 2 "^dpc-shard: option '--seed': '.*5.*' is not an integer$" \
		"$BIN/dpc-shard" prepare --seed "$v" c.jsonl x
	expect_fail 2 "^dpc-shard: option '--random': '.*5.*' is not an integer$" \
		"$BIN/dpc-shard" split --random "$v" d/train.tok
	expect_fail 2 "^dpc-outer: option '--phase': '.*5.*' is not an integer$" \
		"$BIN/dpc-outer" step --phase "$v" run
	expect_fail 2 "^dpc-outer: option '--threads': '.*5.*' is not an integer$" \
		"$BIN/dpc-outer" step --phase 1 --threads "$v" run
	expect_fail 2 "^dpc-outer: option '--wait': '.*5.*' is not a number$" \
		"$BIN/dpc-outer" step --phase 1 --wait="$v" run
	expect_fail 2 "^dpc-outer: option '--slice I': '.*5.*' is not an integer$" \
		"$BIN/dpc-outer" step --phase 1 --slice "$v/8" run
	expect_fail 2 "^dpc-outer: option '--slice N': '.*5.*' is not an integer$" \
		"$BIN/dpc-outer" step --phase 1 --slice "1/$v" run
done
echo "ok"
