#!/bin/sh
# run.sh - run every libFuzzer harness for SECS seconds and say what each did (`make fuzz`).
#
#   sh test/fuzz/run.sh BINDIR WORKDIR SECS NAME...
#
# Each harness NAME starts from its committed corpus (test/fuzz/corpus/NAME, and
# test/fuzz/regress/NAME when there is one) plus what earlier runs found (WORKDIR/NAME, where
# the inputs it finds now go: the committed corpus is never written). It runs in libFuzzer's
# fork mode with crashes, timeouts and out-of-memory ignored, so that one bug does not end
# the run: each is counted, and its input written to test/fuzz/crashes/NAME/. The table gives
# per harness the executions, libFuzzer's final coverage (cov: edges, ft: features), the
# corpus size and the crashes, timeouts and ooms; WORKDIR/NAME.log has libFuzzer's own output.
# Exit 1 when any harness crashed (or ran out of time or memory on an input), when
# test/fuzz/crashes/ still holds inputs, or when a committed regression input still fails
# (fork mode sets crashing seeds aside without counting them; their copies in crashes/ are
# recognised and named); 0 otherwise.
# The harnesses write each input to a file: under FUZZ_TMPDIR, by default /dev/shm when it
# is there (on a disk, /tmp, a run is 20 to 70 times slower).
set -eu
[ $# -ge 4 ] || { echo "usage: run.sh BINDIR WORKDIR SECS NAME..." >&2; exit 2; }
bin=$1 work=$2 secs=$3
shift 3
names=$*
here=test/fuzz
bad=0
count() { find "$1" -type f | wc -l; }
field() { echo "$last" | sed -n "s/.* $1 \([0-9]*\).*/\1/p"; }
if [ -z "${FUZZ_TMPDIR:-}" ]; then
	FUZZ_TMPDIR=${TMPDIR:-/tmp}
	[ -d /dev/shm ] && [ -w /dev/shm ] && FUZZ_TMPDIR=/dev/shm
fi
# One folder for this run's scratch files and libFuzzer's own, removed at the end: a harness
# that crashes under libFuzzer leaves its scratch folder behind.
TMPDIR=$(mktemp -d "$FUZZ_TMPDIR/fuzz-run.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
trap 'exit 130' INT TERM
echo "fuzz: $secs s per harness; scratch files in $TMPDIR; libFuzzer's logs in $work"
printf '%-16s %11s %7s %7s %6s %8s %9s  %s\n' harness executions cov ft corpus crashes \
	"in crashes/" "timeouts/ooms"
for name in $names; do
	mkdir -p "$work/$name" "$here/crashes/$name"
	seeds="$here/corpus/$name"
	[ -d "$here/regress/$name" ] && seeds="$seeds $here/regress/$name"
	log=$work/$name.log
	before=$(count "$here/crashes/$name")
	# shellcheck disable=SC2086 # seeds is a list of folders without spaces
	"$bin/$name" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
		-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="$here/crashes/$name/" "$work/$name" $seeds >"$log" 2>&1 || true
	# Fork mode's status lines: "#RUNS: cov: C ft: F corp: N exec/s E oom/timeout/crash:
	# O/T/X time: Ss job: J dft_time: D"; the last one has the totals.
	last=$(grep -E '^#[0-9]+: cov: ' "$log" | tail -n 1)
	if [ -z "$last" ]; then
		printf '%-16s did not start fuzzing; see %s\n' "$name" "$log"
		tail -n 5 "$log" | sed 's/^/    | /'
		bad=1
		continue
	fi
	runs=$(echo "$last" | sed 's/^#\([0-9]*\):.*/\1/')
	cov=$(field "cov:") ft=$(field "ft:") corp=$(field "corp:")
	ooms=$(echo "$last" | sed -n 's|.*oom/timeout/crash: \([0-9]*\)/.*|\1|p')
	timeouts=$(echo "$last" | sed -n 's|.*oom/timeout/crash: [0-9]*/\([0-9]*\)/.*|\1|p')
	crashes=$(echo "$last" | sed -n 's|.*oom/timeout/crash: [0-9]*/[0-9]*/\([0-9]*\).*|\1|p')
	# A crash on a committed regression input is a known bug not fixed yet: said, and its
	# copy (fork mode's seed merge writes one) not kept.
	known=
	for c in "$here/crashes/$name"/*; do
		[ -f "$c" ] || continue
		for r in "$here/regress/$name"/*; do
			if [ -f "$r" ] && cmp -s "$c" "$r"; then
				known="$known $r"
				rm -f "$c"
				break
			fi
		done
	done
	kept=$(count "$here/crashes/$name")
	printf '%-16s %11s %7s %7s %6s %8s %9s  %s/%s\n' "$name" "$runs" "$cov" "$ft" "$corp" \
		"$crashes" "$kept" "$timeouts" "$ooms"
	for r in $known; do
		echo "    still fails: $r (a known bug, not fixed yet)"
		bad=1
	done
	if [ $((crashes + timeouts + ooms + kept)) -gt 0 ]; then
		bad=1
		echo "    $((kept - before)) new input(s) in $here/crashes/$name"
		# Fork mode's log keeps no child's report: run the first input again for it.
		first=$(find "$here/crashes/$name" -type f | sort | head -n 1)
		if [ -n "$first" ]; then
			echo "    $first:"
			"$bin/$name" "$first" 2>&1 |
				grep -m 1 -E '^fuzz: |ERROR: AddressSanitizer|runtime error|ERROR: libFuzzer' |
				sed 's/^/    | /'
		fi
	fi
done
if [ $bad -ne 0 ]; then
	echo "fuzz: FAILURES: reproduce one with $bin/NAME FILE; move each bug's input from" \
		"$here/crashes/NAME/ to $here/regress/NAME/ (make test replays it), delete the rest"
	exit 1
fi
echo "fuzz: no crash"
