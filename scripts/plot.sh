#!/bin/sh
# plot.sh - training curves: loss against step from metrics files (dpc-train-path -m, a DiPaCo
# run's metrics), several runs on one plot, as a PNG drawn by gnuplot.
#
#   sh scripts/plot.sh [-o OUT.png] [--title TEXT] [--log] METRICS.jsonl...
#
# For each file: its training loss ("event":"train" lines) as a thin line and its validation
# loss (every line with a numeric val_loss: dpc-train-path's "eval" events, a DiPaCo run's
# per-phase "path" events) as points joined by a thicker line, in the same colour,
# labelled with the file's name. Steps are the "step" field (the global step). --log: a
# logarithmic loss axis. Default output: curves.png. Needs gnuplot (Debian: gnuplot-nox).
# Exit 2 on a usage error, 1 when a file is unreadable or holds no training lines.
set -eu

out=curves.png
title="loss against step"
logscale=0
while [ $# -gt 0 ]; do
	case $1 in
	-o) [ $# -ge 2 ] || { echo "plot.sh: -o needs a file" >&2; exit 2; }; out=$2; shift 2 ;;
	--title) [ $# -ge 2 ] || { echo "plot.sh: --title needs a text" >&2; exit 2; }; title=$2; shift 2 ;;
	--log) logscale=1; shift ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	--) shift; break ;;
	-*) echo "plot.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "plot.sh: no metrics file (see --help)" >&2; exit 2; }
command -v gnuplot >/dev/null ||
	{ echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
i=0
plots=""
for f in "$@"; do
	[ -r "$f" ] || { echo "plot.sh: '$f': cannot read" >&2; exit 1; }
	i=$((i + 1))
	# "step":S ... "loss":x of train lines; "step":S ... "val_loss":x of eval lines
	sed -n '/"event":"train"/s/.*"step":\([0-9]*\).*"loss":\([-0-9.eE+]*\).*/\1 \2/p' "$f" \
		>"$tmp/train$i"
	sed -n '/"val_loss":[-0-9]/s/.*"step":\([0-9]*\).*"val_loss":\([-0-9.eE+]*\).*/\1 \2/p' \
		"$f" >"$tmp/val$i"
	[ -s "$tmp/train$i" ] ||
		{ echo "plot.sh: '$f': no training lines (\"event\":\"train\" with step and loss)" >&2; exit 1; }
	name=$(basename "$f" | sed 's/"/\\"/g')
	plots="$plots${plots:+, }'$tmp/train$i' using 1:2 with lines lw 1 lc $i title \"$name train\""
	[ -s "$tmp/val$i" ] &&
		plots="$plots, '$tmp/val$i' using 1:2 with linespoints lw 2 pt 7 lc $i title \"$name val\""
done
{
	echo "set terminal pngcairo size 1000,600 noenhanced"
	echo "set output '$tmp/out.png'"
	echo "set title \"$(echo "$title" | sed 's/"/\\"/g')\""
	echo "set xlabel 'step'; set ylabel 'loss (nats/token)'; set grid; set key outside right"
	[ $logscale = 1 ] && echo "set logscale y"
	echo "plot $plots"
} >"$tmp/plot.gp"
gnuplot "$tmp/plot.gp" 2>"$tmp/err" || { echo "plot.sh: gnuplot failed: $(head -1 "$tmp/err")" >&2; exit 1; }
mv "$tmp/out.png" "$out"
echo "plot.sh: wrote $out ($i run$( [ $i = 1 ] || echo s))"
