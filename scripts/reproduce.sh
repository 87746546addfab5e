#!/bin/sh
# reproduce.sh - the DiPaCo paper's comparisons on Brown, from a bare Debian 12 to a results
# page with tables and plots.
#
#   sh scripts/reproduce.sh [options] [RUNDIR]          (default RUNDIR: runs/reproduce)
#     --inner-steps N   inner steps per phase (default 50)
#     --phases T        phases, even (default 4); the re-sharded run is re-sharded after T/2
#     --quick           a small model (4 blocks of width 64), by default 2 phases of 10
#                       steps: a few minutes, to check the script, not the claims; the page
#                       goes to RUNDIR/brown.md unless -o says otherwise
#     -o PAGE           the results page (default results/brown.md); its PNG plots are
#                       written beside it as PAGE's name without .md, then -loss-steps.png,
#                       -loss-flops.png and -outer.png
#     --no-setup        skip apt-get and make (the programs are built, the tools there)
#
# Every configuration trains on the same Brown data (the quickstart's: documents cut into
# 1024-token pieces; train, router 3% and validation 5% of the source documents) for the same
# number of inner steps per path, T phases of N steps, batch 8 x 256 tokens:
#   dense S       one path of gpt-tiny (3.36M parameters); also the base model the routers'
#                 features come from; and again with 3 other seeds, for the noise floor
#   dense 4S      one path of 3.9 times the parameters (width 512 instead of 256), at the
#                 shared learning rate and again at half of it (Adam's rate scaled as 1/width):
#                 the better of the two is the one the orderings are judged against
#   DiLoCo        4 workers on random shards, one module: averaged deltas, outer Nesterov
#   flat MoE      4 paths that share nothing, on the k-means shards
#   DiPaCo 2x2    4 paths sharing 2 + 2 modules, on the k-means shards (k = 4, features of
#                 the dense S model); the same on top-2 overlapping shards; the same re-sharded
#                 after phase T/2 by a discriminative router fitted on that phase's paths; and
#                 a 2x2 with a path-specific level (the last block and the head)
# Each is evaluated on the validation split once per document and re-routing every 64 tokens
# (a window router fitted on the router split), after the last phase; and once per document
# on a quarter of the validation documents after every phase, for the curves. Then
# scripts/reproduce-report.py writes the page from the runs' files.
#
# Resumable: every stage is skipped when its output is there, and a DiPaCo run redoes only its
# missing tasks (scripts/dipaco-train.sh), so the same command after a kill goes on where it
# stopped and writes the same page (the wall times aside). One progress line per stage on
# stderr. About 45 minutes on 2 idle cores with the defaults; --quick, a few.
set -eu
cd "$(dirname "$0")/.."
top=$(pwd)
bin=$top/build/bin
tau="" phases="" quick=0 setup=1 page=""
need() { [ "$2" -ge 2 ] || { echo "reproduce.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
die() { echo "reproduce.sh: $*" >&2; exit 1; }
posint() { case $2 in '' | *[!0-9]* | 0*) echo "reproduce.sh: $1 wants a positive integer, not '$2'" >&2; exit 2 ;; esac; }
while [ $# -gt 0 ]; do
	case $1 in
	--inner-steps) need "$1" $#; posint "$1" "$2"; tau=$2; shift 2 ;;
	--phases) need "$1" $#; posint "$1" "$2"; phases=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	-o) need "$1" $#; page=$2; shift 2 ;;
	--no-setup) setup=0; shift ;;
	-h | --help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	-*) echo "reproduce.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -le 1 ] || { echo "reproduce.sh: one RUNDIR at most, not $# arguments (see --help)" >&2; exit 2; }
run=${1:-runs/reproduce}
if [ "$quick" = 1 ]; then
	: "${tau:=10}" "${phases:=2}"
fi
: "${tau:=50}" "${phases:=4}"
[ $((phases % 2)) = 0 ] || { echo "reproduce.sh: --phases must be even (the re-sharding is after T/2), not $phases" >&2; exit 2; }
half=$((phases / 2))
d_page=results/brown.md
[ "$quick" = 1 ] && d_page=$run/brown.md
: "${page:=$d_page}"
chunked=data/brown-1k prefix=128 window=64
steps=$((phases * tau))
warmup=20
[ "$warmup" -le $((steps / 4)) ] || warmup=$((steps / 4 > 0 ? steps / 4 : 1))
# The model and the schedule, the same for every configuration (dense 4S widens the model).
sets="-s dipaco.phases=$phases -s dipaco.inner_steps=$tau -s train.steps=$steps -s train.warmup_steps=$warmup"
width=256 heads=4
if [ "$quick" = 1 ]; then
	width=64 heads=2
	sets="$sets -s model.n_embd=$width -s model.n_head=$heads"
fi

t0=$(date +%s)
n=0
stage() {
	n=$((n + 1))
	echo "reproduce [$n/20, $(($(date +%s) - t0)) s] $*" >&2
}

stage "setup: packages and build"
if [ "$setup" = 1 ]; then
	sh scripts/setup-debian.sh --reproduce
	make -s
fi
for p in dpc-outer dpc-shard dpc-train-path dpc-route; do
	[ -x "$bin/$p" ] || die "$bin/$p is not built (run make)"
done
for t in python3 gnuplot; do
	command -v $t >/dev/null || die "$t not found (sh scripts/setup-debian.sh --reproduce)"
done

stage "data: Brown, cut into 1024-token pieces ($chunked)"
sh scripts/brown-1k.sh "$bin"
train=$chunked/train.tok val=$chunked/val.tok router=$chunked/router.tok
mkdir -p "$run/routing" "$run/eval"
# What produced this run, for the page; a run made with other settings is not mixed in.
want="inner_steps=$tau phases=$phases quick=$quick"
if [ -e "$run/settings" ]; then
	[ "$(cat "$run/settings")" = "$want" ] ||
		die "$run was made with '$(cat "$run/settings")', not '$want' (use another RUNDIR)"
else
	echo "$want" >"$run/settings"
fi

# train NAME CONFIG JOBS THREADS [SETS...]: one configuration under scripts/dipaco-train.sh,
# its shards already in $run/NAME/shards or drawn there at random; its wall time is kept in
# $run/NAME/wall (the invocation that finished it) with its parameter counts.
train() {
	name=$1 cfg=$2 j=$3 th=$4
	shift 4
	dir=$run/$name
	[ -s "$dir/wall" ] && return 0
	s=$(date +%s)
	resumed=no
	[ -e "$dir/started" ] && resumed=yes
	mkdir -p "$dir" && : >"$dir/started"
	# shellcheck disable=SC2086
	sh scripts/dipaco-train.sh -q -j "$j" -t "$th" $sets "$@" "configs/$cfg" "$dir" "$train" \
		"$val" >"$dir.table.tmp"
	mv "$dir.table.tmp" "$dir/table"
	# shellcheck disable=SC2086
	"$bin/dpc-outer" topology --json -c "$dir/config.yaml" >"$dir/topology.json"
	echo "$(($(date +%s) - s)) $j $th $resumed" >"$dir/wall.tmp" && mv "$dir/wall.tmp" "$dir/wall"
}
last=$(printf 'phase-%04d' "$phases")

stage "dense S: gpt-tiny, one path, $phases x $tau steps (also the routers' base model)"
train dense-s dense.yaml 1 2
base=$run/dense-s/$last/paths/path-000.safetensors
[ -s "$base" ] || die "$base is missing after training dense S"
for seed in 2 3 4; do
	stage "dense S again with seed $seed (the noise floor)"
	train dense-s-seed$seed dense.yaml 1 2 -s train.seed=$seed
done
stage "dense 4S: width $((2 * width)), 3.9x the parameters of a path"
train dense-4s dense.yaml 1 2 -s model.n_embd=$((2 * width)) -s model.n_head=$((2 * heads))
stage "dense 4S at half the learning rate"
lr=$(sed -n 's/^ *lr: *//p' configs/dense.yaml)
train dense-4s-halflr dense.yaml 1 2 -s model.n_embd=$((2 * width)) -s model.n_head=$((2 * heads)) \
	-s train.lr="$(awk "BEGIN { print $lr / 2 }")"

stage "routing: features of the base model, k-means to 4 paths, top-1 and top-2 shards"
r=$run/routing
for s in train router val; do
	[ -s "$r/features-$s.safetensors" ] ||
		"$bin/dpc-route" features -q --prefix $prefix -m "$base" \
			-o "$r/features-$s.safetensors" "$chunked/$s.tok" >/dev/null
done
[ -s "$r/kmeans.safetensors" ] ||
	"$bin/dpc-route" kmeans -k 4 -o "$r/kmeans.safetensors" "$r/features-train.safetensors" >/dev/null
# shards NAME TOP ROUTER FEATURES IN.tok: a routed split into $run/NAME/shards, its report kept
shards() {
	[ -s "$run/$1/shards/shards.json" ] && return 0
	mkdir -p "$run/$1"
	"$bin/dpc-shard" split --top "$2" --router "$3" --features "$4" "$5" "$run/$1/shards" \
		>/dev/null 2>"$run/$1/routing.txt" || { cat "$run/$1/routing.txt" >&2; exit 1; }
}
for c in flat-moe dipaco-km dipaco-head; do
	shards $c 1 "$r/kmeans.safetensors" "$r/features-train.safetensors" "$train"
done
shards dipaco-top2 2 "$r/kmeans.safetensors" "$r/features-train.safetensors" "$train"
# The curves' validation set: a quarter of the validation documents, drawn once.
[ -s "$r/val-quarter/shards.json" ] ||
	"$bin/dpc-shard" split -q --random 4 --seed 1 "$val" "$r/val-quarter" >/dev/null
valq=$r/val-quarter/shard-000.tok

stage "DiLoCo: 4 workers on random shards"
train diloco diloco.yaml 2 1
stage "flat MoE: 4 paths sharing nothing, k-means shards"
train flat-moe flat-moe.yaml 2 1
stage "DiPaCo 2x2 on k-means shards"
train dipaco-km dipaco-2x2.yaml 2 1
stage "DiPaCo 2x2 on top-2 overlapping k-means shards"
train dipaco-top2 dipaco-2x2.yaml 2 1
stage "DiPaCo 2x2 with a path-specific level (last block and head)"
train dipaco-head dipaco-2x2-head.yaml 2 1

stage "DiPaCo 2x2 re-sharded after phase $half by a discriminative router"
hp=$(printf 'phase-%04d' "$half")
[ -s "$r/scores-km-$hp.safetensors" ] ||
	"$bin/dpc-route" score -q --run "$run/dipaco-km" --phase "$half" --prefix $prefix \
		-o "$r/scores-km-$hp.safetensors" "$router" >/dev/null
[ -s "$r/disc-km-$hp.safetensors" ] ||
	"$bin/dpc-route" fit -q --scores "$r/scores-km-$hp.safetensors" \
		--features "$r/features-router.safetensors" -o "$r/disc-km-$hp.safetensors" \
		"$router" >"$r/disc-km-$hp.json"
d=$run/dipaco-disc
if [ ! -d "$d" ]; then
	# Its first T/2 phases are dipaco-km's, copied: the same config, shards and seed.
	rm -rf "$d.tmp"
	mkdir "$d.tmp"
	cp -r "$run/dipaco-km/config.yaml" "$run/dipaco-km/shards" "$run/dipaco-km/val.tok" "$d.tmp/"
	t=0
	while [ $t -le "$half" ]; do
		cp -r "$run/dipaco-km/$(printf 'phase-%04d' $t)" "$d.tmp/"
		t=$((t + 1))
	done
	mv "$d.tmp" "$d"
fi
[ -s "$d/$hp/shards/shards.json" ] ||
	"$bin/dpc-shard" split --router "$r/disc-km-$hp.safetensors" \
		--features "$r/features-train.safetensors" "$train" "$d/$hp/shards" \
		>/dev/null 2>"$d/routing.txt" || { cat "$d/routing.txt" >&2; exit 1; }
train dipaco-disc dipaco-2x2.yaml 2 1

stage "scoring the router split with every routed run's final paths"
for c in flat-moe dipaco-km dipaco-top2 dipaco-head dipaco-disc; do
	[ -s "$r/scores-$c.safetensors" ] ||
		"$bin/dpc-route" score -q --run "$run/$c" --prefix $prefix \
			-o "$r/scores-$c.safetensors" "$router" >/dev/null
done
stage "fitting window routers (every $window tokens) and a discriminative router for k-means"
for c in flat-moe dipaco-km dipaco-top2 dipaco-head dipaco-disc; do
	[ -s "$r/window-$c.safetensors" ] ||
		"$bin/dpc-route" fit -q --scores "$r/scores-$c.safetensors" --window $window -m "$base" \
			-o "$r/window-$c.safetensors" "$router" >"$r/window-$c.json"
done
[ -s "$r/disc-dipaco-km.safetensors" ] ||
	"$bin/dpc-route" fit -q --scores "$r/scores-dipaco-km.safetensors" \
		--features "$r/features-router.safetensors" -o "$r/disc-dipaco-km.safetensors" \
		"$router" >"$r/disc-dipaco-km.json"

# evaluate OUT RUN PHASE IN.tok [ROUTER [WINDOW-ROUTER]]
evaluate() {
	[ -s "$run/eval/$1.json" ] && return 0
	o=$1 c=$2 p=$3 in=$4
	shift 4
	set -- ${1:+--router "$1"} ${2:+--window-router "$2"}
	"$bin/dpc-route" eval -q --run "$run/$c" --phase "$p" -m "$base" "$@" \
		--score-from $prefix --json "$run/eval/$o.json" "$in" >/dev/null
}
# The document router each run is evaluated with: its own shards' router (the one-path and
# one-module runs need none: DiLoCo's 4 paths are one model after each outer step).
router_of() {
	case $1 in
	dense-*) echo "" ;;
	dipaco-disc) [ "$2" -gt "$half" ] && echo "$r/disc-km-$hp.safetensors" || echo "$r/kmeans.safetensors" ;;
	*) echo "$r/kmeans.safetensors" ;;
	esac
}
all="dense-s dense-s-seed2 dense-s-seed3 dense-s-seed4 dense-4s dense-4s-halflr diloco flat-moe dipaco-km dipaco-top2 dipaco-head dipaco-disc"
stage "evaluating every phase once per document on a quarter of the validation split"
for c in $all; do
	t=1
	while [ $t -le "$phases" ]; do
		evaluate "$c-curve-$t" "$c" $t "$valq" "$(router_of "$c" $t)"
		t=$((t + 1))
	done
done
stage "evaluating the last phase on the validation split: once per document, every $window tokens"
for c in $all; do
	w=""
	case $c in flat-moe | dipaco-*) w=$r/window-$c.safetensors ;; esac
	evaluate "$c-final" "$c" "$phases" "$val" "$(router_of "$c" "$phases")" "$w"
done
evaluate dipaco-km-disc-final dipaco-km "$phases" "$val" "$r/disc-dipaco-km.safetensors" \
	"$r/window-dipaco-km.safetensors"

stage "writing $page and its plots"
mkdir -p "$(dirname "$page")"
cmd="sh scripts/reproduce.sh"
[ "$quick" = 1 ] && cmd="$cmd --quick"
d_tau=50 d_phases=4
[ "$quick" = 1 ] && d_tau=10 d_phases=2
[ "$tau" = $d_tau ] || cmd="$cmd --inner-steps $tau"
[ "$phases" = $d_phases ] || cmd="$cmd --phases $phases"
[ "$page" = "$d_page" ] || cmd="$cmd -o $page"
[ "$run" = runs/reproduce ] || cmd="$cmd $run"
python3 scripts/reproduce-report.py --run "$run" --command "$cmd" \
	--commit "$(git describe --always --dirty 2>/dev/null || echo unknown)" -o "$page"
echo "reproduce.sh: done in $(($(date +%s) - t0)) s: $page" >&2
