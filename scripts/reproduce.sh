#!/bin/sh
# reproduce.sh - the DiPaCo paper's comparisons on Brown, run as the paper runs them, from a
# bare Debian 12 to a results page with tables and plots.
#
#   sh scripts/reproduce.sh [options] [RUNDIR]          (default RUNDIR: runs/reproduce)
#     --phases T        phases of every forked run (default 16), a multiple of 4: the sweep
#                       runs T/4 of them, the re-sharded runs are re-sharded after T/2
#     --inner-steps N   inner steps per phase (default 32)
#     --quick           a small model (width 32), by default 4 phases of 16 steps and a
#                       smaller sweep: a few minutes, to check the script, not the claims;
#                       the page goes to RUNDIR/brown.md unless -o says otherwise
#     -o PAGE           the results page (default results/brown.md); its PNG plots are
#                       written beside it as PAGE's name without .md, then -loss-steps.png,
#                       -loss-flops.png and -outer.png
#     --no-setup        skip apt-get and make (the programs are built, the tools there)
#     --sweep-from DIR  take the sweep's scores from DIR (its settings file and sweep-*.json,
#                       as a run's eval/ holds them, and a line in DIR/source saying where
#                       they were measured) instead of running the sweep: the full runs start
#                       at once, with the settings that sweep chose, and the page says where
#                       the sweep came from. results/brown-sweep is one, measured with the
#                       defaults; the sweep is about a third of the run's time. DIR, as
#                       RUNDIR, is relative to the repository's top
#
# The protocol (DiPaCo, arXiv 2403.10616, Algorithm 1 and section 4; DiLoCo, 2311.08105):
#   base          dense S (4 blocks of width 128, 0.87M parameters) trained on all the
#                 training data for B = 3T/8 phases' worth of steps of a schedule that spans
#                 B + T phases: the paper forks from a 150M model at 24k of 88k steps. The
#                 routers' features come from it, and every row below but dense 4S starts
#                 from it (dpc-outer init --from): the same fork for every row.
#   sweep         on a short budget (T/4 phases), forked from the base: the outer optimizer
#                 (outer lr 0.3 0.5 0.7 1.0 x momentum 0 0.5 0.9, and sqrt(P) rescaling on
#                 with momentum 0.9)
#                 for DiLoCo and for DiPaCo 2x2 alike; then the fork's learning rate (re-warm
#                 to the peak, to half the peak, or continue at the base's rate) for dense S,
#                 DiLoCo and DiPaCo at their best outer settings. The best of each is carried
#                 into the full runs; plain averaging (lr 1, momentum 0, no rescaling) is in
#                 the grid, and also run in full for DiPaCo.
#   dense S       the base continued for T phases as one path, 4 seeds (the batches' order):
#                 the noise floor of one path
#   dense S x4    the same for 4x the inner steps of each phase: one model reading every token
#                 the 4-path runs read, for their FLOPs (the paper's Table 1 at equal budgets)
#   dense 4S      width 256 (3.36M parameters, 3.9x), from scratch for B + T phases, at the
#                 base's learning rate and at half of it: the capacity precondition (dense 4S
#                 must beat dense S beyond the floor, or capacity claims are not testable here)
#   DiLoCo        4 workers on random shards, one module
#   flat MoE      4 paths that share nothing, on the k-means shards
#   DiPaCo 2x2    4 paths sharing 2 + 2 modules on the k-means shards (k = 4, features of the
#                 base), 4 seeds (the noise floor of DiPaCo); on top-2 overlapping shards;
#                 re-sharded after phase T/2 by a discriminative router fitted on that phase's
#                 paths, the schedule restarting there (train.restart_step, the paper's
#                 figure 10); the paper's recipe, all three (k-means, top-2, one
#                 discriminative re-sharding); a path-specific level (the last block and the
#                 head); plain averaging as the outer step; the paper's early stopping (each
#                 shard's last 5% held out, dipaco.holdout; each path evaluated at the phase
#                 of its lowest loss there, dpc-route eval --early-stop); and the paths
#                 starting from the base's AdamW moments (dpc-outer init --moments)
# Each is evaluated after the last phase on the validation split, every row scored from byte
# 128 of each piece (dpc-route eval --score-from 128; the report refuses rows scored on other
# counts), once per document and re-routing every 64 tokens (a window router fitted on the
# router split); after every phase on a quarter of the validation documents, for the curves;
# and on a text the project never trained or tuned on (the licence texts every Debian has in
# /usr/share/common-licenses). Then scripts/reproduce-report.py writes the page.
#
# Resumable: every stage is skipped when its output is there, and a run redoes only its
# missing tasks (scripts/dipaco-train.sh), so the same command after a kill goes on where it
# stopped and writes the same page (the wall times aside). One progress line per stage on
# stderr. About 1 to 2 hours on 2 idle cores with the defaults (the CPU decides); --quick, a
# few minutes.
set -eu
cd "$(dirname "$0")/.."
top=$(pwd)
bin=$top/build/bin
tau="" phases="" quick=0 setup=1 page="" sweep_from=""
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
	--sweep-from) need "$1" $#; sweep_from=$2 sweep_arg=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	-*) echo "reproduce.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -le 1 ] || { echo "reproduce.sh: one RUNDIR at most, not $# arguments (see --help)" >&2; exit 2; }
run=${1:-runs/reproduce}
if [ "$quick" = 1 ]; then
	: "${tau:=16}" "${phases:=4}"
fi
: "${tau:=32}" "${phases:=16}"
[ $((phases % 4)) = 0 ] || { echo "reproduce.sh: --phases must be a multiple of 4 (the sweep runs T/4, the re-sharding is after T/2), not $phases" >&2; exit 2; }
want="inner_steps=$tau phases=$phases quick=$quick protocol=3"
if [ -n "$sweep_from" ]; then
	sf=$sweep_from
	[ -d "$sf" ] || { echo "reproduce.sh: --sweep-from '$sf': not a directory" >&2; exit 2; }
	[ -s "$sf/settings" ] && [ -s "$sf/source" ] ||
		{ echo "reproduce.sh: --sweep-from '$sf': no settings or source file there" >&2; exit 2; }
	[ "$(cat "$sf/settings")" = "$want" ] ||
		{ echo "reproduce.sh: --sweep-from '$sf': measured with '$(cat "$sf/settings")', not '$want'" >&2; exit 2; }
	ls "$sf"/sweep-*.json >/dev/null 2>&1 ||
		{ echo "reproduce.sh: --sweep-from '$sf': no sweep-*.json there" >&2; exit 2; }
	sweep_from=$(cd "$sf" && pwd)
fi
d_page=results/brown.md
[ "$quick" = 1 ] && d_page=$run/brown.md
: "${page:=$d_page}"
chunked=data/brown-1k prefix=128 window=64
half=$((phases / 2)) quarter=$((phases / 4))
bphases=$(((3 * phases + 4) / 8))       # the base's share: 3/8 of the forks' phases
fsteps=$((phases * tau)) bsteps=$((bphases * tau)) total=$(((bphases + phases) * tau))
warmup=20
[ "$warmup" -le $((tau / 2)) ] || warmup=$((tau / 2 > 0 ? tau / 2 : 1))
width=128 heads=2
[ "$quick" = 1 ] && width=32 heads=2
lr=$(sed -n 's/^ *lr: *//p' configs/dense.yaml)
minfrac=$(sed -n 's/^ *min_lr_frac: *//p' configs/dense.yaml)
# The model of every row but dense 4S, and the forks' schedule: T phases of tau steps.
model="-s model.n_embd=$width -s model.n_head=$heads"
fork="-s dipaco.phases=$phases -s dipaco.inner_steps=$tau -s train.steps=$fsteps"
# The fork's learning rate, three ways: re-warm to the peak, to half of it, or go on from the
# base's rate at step B of its schedule (warmup 0, the cosine from there to the same floor).
base_rate=$(awk "BEGIN { p = ($bsteps - $warmup) / ($total - $warmup);
	print $lr * ($minfrac + (1 - $minfrac) * 0.5 * (1 + cos(3.141592653589793 * p))) }")
forkrate() {
	case $1 in
	peak) echo "-s train.lr=$lr -s train.warmup_steps=$warmup" ;;
	half) echo "-s train.lr=$(awk "BEGIN { print $lr / 2 }") -s train.warmup_steps=$warmup" ;;
	base) echo "-s train.lr=$base_rate -s train.warmup_steps=0 -s train.min_lr_frac=$(awk "BEGIN { print $lr * $minfrac / $base_rate }")" ;;
	esac
}
outer() { # outer LR MU RESCALE
	echo "-s dipaco.outer_lr=$1 -s dipaco.outer_momentum=$2 -s dipaco.rescale=$3"
}
if [ "$quick" = 1 ]; then
	sweep_lr="0.7 1.0" sweep_mu="0 0.9" sweep_rs="true false"
else
	sweep_lr="0.3 0.5 0.7 1.0" sweep_mu="0 0.5 0.9" sweep_rs="true false"
fi

t0=$(date +%s)
n=0
stage() {
	n=$((n + 1))
	echo "reproduce [$n/33, $(($(date +%s) - t0)) s] $*" >&2
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

stage "data: Brown, cut into 1024-token pieces ($chunked); the licence texts as unseen text"
sh scripts/brown-1k.sh "$bin"
train=$chunked/train.tok val=$chunked/val.tok router=$chunked/router.tok
mkdir -p "$run/routing" "$run/eval" "$run/sweep"
# What produced this run, for the page; a run made with other settings is not mixed in.
if [ -e "$run/settings" ]; then
	[ "$(cat "$run/settings")" = "$want" ] ||
		die "$run was made with '$(cat "$run/settings")', not '$want' (use another RUNDIR)"
else
	echo "$want" >"$run/settings"
fi
# A sweep taken from elsewhere: its scores stand in for the sweep's runs (each run is skipped
# when its score is there), and where they came from goes to the page. Scores the run has
# already are kept.
if [ -n "$sweep_from" ]; then
	for f in "$sweep_from"/sweep-*.json; do
		b=${f##*/}
		[ -e "$run/eval/$b" ] && continue
		cp "$f" "$run/eval/$b.tmp" && mv "$run/eval/$b.tmp" "$run/eval/$b"
	done
	cp "$sweep_from/source" "$run/sweep/from"
fi
# Unseen text: the licences of /usr/share/common-licenses (base-files), one document each,
# cut into 1024-byte pieces as Brown is.
unseen=$run/unseen/train.tok
if [ ! -s "$unseen" ]; then
	python3 - "$run/unseen.jsonl" <<'EOF'
import glob, json, os, sys
with open(sys.argv[1] + ".tmp", "w") as f:
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and not os.path.islink(p):
            f.write(json.dumps({"id": os.path.basename(p), "text": open(p, errors="replace").read()}) + "\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
EOF
	"$bin/dpc-shard" prepare --force --chunk 1024 --val-frac 0 --router-frac 0 \
		"$run/unseen.jsonl" "$run/unseen" >/dev/null
fi

# train NAME CONFIG JOBS THREADS [ARGS...]: one configuration under scripts/dipaco-train.sh
# (ARGS: its -s overrides, --from, --until, and the router of its shards, else they are
# drawn at random); its wall time is kept in $run/NAME/wall (the invocation that finished it).
# A run stopped with --until is finished by the same call without it.
train() {
	name=$1 cfg=$2 j=$3 th=$4
	shift 4
	dir=$run/$name
	[ -s "$dir/wall" ] && return 0
	s=$(date +%s) before=0
	resumed=no
	[ -e "$dir/started" ] && resumed=yes
	[ -s "$dir/wall.part" ] && before=$(cut -d' ' -f1 "$dir/wall.part")
	mkdir -p "$dir" && : >"$dir/started"
	sh scripts/dipaco-train.sh -q -j "$j" -t "$th" "$@" "configs/$cfg" "$dir" "$train" \
		"$val" >"$dir.table.tmp"
	case " $* " in *" --until "*)
		# the first part of a run to be re-sharded: its time is added to the rest's
		rm -f "$dir.table.tmp" "$dir/started"
		[ -s "$dir/wall.part" ] || echo "$(($(date +%s) - s)) $resumed" >"$dir/wall.part"
		return 0 ;;
	esac
	mv "$dir.table.tmp" "$dir/table"
	"$bin/dpc-outer" topology --json -c "$dir/config.yaml" >"$dir/topology.json"
	echo "$(($(date +%s) - s + before)) $j $th $resumed" >"$dir/wall.tmp" && mv "$dir/wall.tmp" "$dir/wall"
}
r=$run/routing
base=$run/base/base.safetensors

stage "base: dense S, $bsteps of a $total-step schedule (the fork of every row)"
if [ ! -s "$base" ]; then
	mkdir -p "$run/base"
	s=$(date +%s)
	# shellcheck disable=SC2086
	"$bin/dpc-train-path" -q -c configs/dense.yaml $model -s dipaco.phases=1 \
		-s dipaco.inner_steps=0 -s train.steps=$total -s train.warmup_steps=$warmup \
		-s train.eval_every=0 -u $bsteps -t 2 -d "$train" -o "$base" --force >/dev/null
	echo "$(($(date +%s) - s)) 1 2 no" >"$run/base/wall"
fi

stage "routing: features of the base, k-means to 4 paths"
for s in train router val; do
	[ -s "$r/features-$s.safetensors" ] ||
		"$bin/dpc-route" features -q --prefix $prefix -m "$base" \
			-o "$r/features-$s.safetensors" "$chunked/$s.tok" >/dev/null
done
[ -s "$r/kmeans.safetensors" ] ||
	"$bin/dpc-route" kmeans -k 4 -o "$r/kmeans.safetensors" "$r/features-train.safetensors" >/dev/null
# and to 8 paths, for the run that trains 4 of 8 paths a phase
[ -s "$r/kmeans8.safetensors" ] ||
	"$bin/dpc-route" kmeans -k 8 -o "$r/kmeans8.safetensors" "$r/features-train.safetensors" >/dev/null
# The k-means shards of a run, top-1 and top-2 (scripts/dipaco-train.sh splits the training
# tokens into the run's shards, its report in RUNDIR/routing.txt)
km1="--router $r/kmeans.safetensors --features $r/features-train.safetensors --top 1"
km2="--router $r/kmeans.safetensors --features $r/features-train.safetensors --top 2"
km8="--router $r/kmeans8.safetensors --features $r/features-train.safetensors --top 1"
# The curves' validation set: a quarter of the validation documents, drawn once.
[ -s "$r/val-quarter/shards.json" ] ||
	"$bin/dpc-shard" split -q --random 4 --seed 1 "$val" "$r/val-quarter" >/dev/null
valq=$r/val-quarter/shard-000.tok

# evaluate OUT RUNDIR PHASE IN.tok [ROUTER [WINDOW-ROUTER]]: dpc-route eval's JSON into
# $run/eval/OUT.json, every row scored from byte $prefix on; $evx: more options of eval
evx=""
evaluate() {
	[ -s "$run/eval/$1.json" ] && return 0
	o=$1 rd=$2 p=$3 in=$4
	shift 4
	set -- ${1:+--router "$1"} ${2:+--window-router "$2"}
	"$bin/dpc-route" eval -q --run "$rd" --phase "$p" -m "$base" "$@" $evx \
		--score-from $prefix --json "$run/eval/$o.json" "$in" >/dev/null
}

# ---- the sweep: short runs forked from the base -------------------------------------------
stage "sweep: the outer optimizer of DiLoCo and DiPaCo 2x2 on $quarter phases"
short="-s dipaco.phases=$quarter -s dipaco.inner_steps=$tau -s train.steps=$((quarter * tau))"
# sweep_run NAME CONFIG ROUTER SETS...: one short run and its loss on the quarter split
sweep_run() {
	sn=$1 cfg=$2 rt=$3
	shift 3
	[ -s "$run/eval/sweep-$sn.json" ] && return 0
	d=$run/sweep/$sn km=""
	[ "$cfg" = diloco.yaml ] || [ "$cfg" = dense.yaml ] || km=$km1
	# shellcheck disable=SC2086
	sh scripts/dipaco-train.sh -q -j 2 -t 1 --from "$base" $km $model $short "$@" \
		"configs/$cfg" "$d" "$train" >/dev/null
	evaluate "sweep-$sn" "$d" "$quarter" "$valq" "$rt"
	rm -rf "$d"/phase-*/paths # the modules are enough; the paths are most of the bytes
}
for m in diloco dipaco; do
	cfg=diloco.yaml rt=$r/kmeans.safetensors
	[ $m = dipaco ] && cfg=dipaco-2x2.yaml
	for olr in $sweep_lr; do
		for mu in $sweep_mu; do
			for rs in $sweep_rs; do
				# sqrt(P) rescaling is swept with Nesterov's momentum 0.9, the setting it
				# comes with in DiLoCo (without momentum it only multiplies the outer lr)
				[ "$rs" = false ] || [ "$mu" = 0.9 ] || continue
				# shellcheck disable=SC2046
				sweep_run "$m-lr$olr-mu$mu-rs$rs-peak" $cfg "$rt" $(outer $olr $mu $rs) $(forkrate peak)
			done
		done
	done
done
# best METHOD-: the sweep run of METHOD with the lowest loss ("NAME LOSS")
best() {
	python3 - "$run/eval" "$1" <<'EOF'
import glob, json, os, sys
rows = []
for p in glob.glob(os.path.join(sys.argv[1], "sweep-%s*.json" % sys.argv[2])):
    e = json.load(open(p))
    rows.append((e["modes"][0]["loss"], os.path.basename(p)[6:-5]))
print("%s %.6f" % min(rows)[::-1])
EOF
}
# the outer settings of a sweep name: NAME = METHOD-lrX-muY-rsZ-FORK
outer_of() { echo "$1" | sed 's/^[a-z]*-lr\([^-]*\)-mu\([^-]*\)-rs\([a-z]*\)-.*/\1 \2 \3/'; }
stage "sweep: the fork's learning rate (peak, half, the base's rate) at each one's best"
for m in diloco dipaco; do
	cfg=diloco.yaml rt=$r/kmeans.safetensors
	[ $m = dipaco ] && cfg=dipaco-2x2.yaml
	# shellcheck disable=SC2046
	set -- $(outer_of "$(best "$m-" | cut -d' ' -f1)")
	for fr in half base; do
		# shellcheck disable=SC2046
		sweep_run "$m-lr$1-mu$2-rs$3-$fr" $cfg "$rt" $(outer $1 $2 $3) $(forkrate $fr)
	done
done
for fr in peak half base; do
	# shellcheck disable=SC2046
	sweep_run "dense-lr1.0-mu0-rsfalse-$fr" dense.yaml "" $(forkrate $fr)
done
# The carried settings: outer step and fork rate of the best of each method.
carry() {
	b=$(best "$1-" | cut -d' ' -f1)
	# shellcheck disable=SC2046
	set -- $(outer_of "$b") "${b##*-}"
	echo "$(outer $1 $2 $3) $(forkrate $4)"
}
dense_sets=$(forkrate "$(best dense- | cut -d' ' -f1 | sed 's/.*-//')")
diloco_sets=$(carry diloco)
dipaco_sets=$(carry dipaco)
avg_sets="$(outer 1.0 0 false) $(forkrate "$(best dipaco- | cut -d' ' -f1 | sed 's/.*-//')")"
echo "dense $dense_sets
diloco $diloco_sets
dipaco $dipaco_sets" >"$run/sweep/carried"

# ---- the full runs ----------------------------------------------------------------------
for seed in 1 2 3 4; do
	nm=dense-s
	[ $seed = 1 ] || nm=dense-s-seed$seed
	stage "dense S continued from the base, seed $seed"
	# shellcheck disable=SC2086
	train $nm dense.yaml 1 2 --from "$base" $model $fork $dense_sets -s train.seed=$seed
done
# Dense S matched in tokens and FLOPs (Table 1): one model reading every token the 4-path
# runs' paths read, 4x the inner steps of each phase, the same fork and learning rate.
stage "dense S continued from the base for 4x the steps: the 4-path runs' tokens and FLOPs"
# shellcheck disable=SC2086
train dense-tm dense.yaml 1 2 --from "$base" $model -s dipaco.phases=$phases \
	-s dipaco.inner_steps=$((4 * tau)) -s train.steps=$((4 * fsteps)) $dense_sets
all4=$((bphases + phases))
for h in full half; do
	nm=dense-4s l=$lr
	[ $h = half ] && nm=dense-4s-halflr l=$(awk "BEGIN { print $lr / 2 }")
	stage "dense 4S from scratch: width $((2 * width)), $total steps, learning rate $l"
	train $nm dense.yaml 1 2 -s model.n_embd=$((2 * width)) -s model.n_head=$((2 * heads)) \
		-s dipaco.phases=$all4 -s dipaco.inner_steps=$tau -s train.steps=$total \
		-s train.warmup_steps=$warmup -s train.lr="$l"
done
# shellcheck disable=SC2086
{
	stage "DiLoCo: 4 workers on random shards"
	train diloco diloco.yaml 2 1 --from "$base" $model $fork $diloco_sets
	stage "flat MoE: 4 paths sharing nothing, k-means shards"
	train flat-moe flat-moe.yaml 2 1 --from "$base" $km1 $model $fork $dipaco_sets
	for seed in 1 2 3 4; do
		nm=dipaco-km
		[ $seed = 1 ] || nm=dipaco-km-seed$seed
		stage "DiPaCo 2x2 on k-means shards, seed $seed"
		train $nm dipaco-2x2.yaml 2 1 --from "$base" $km1 $model $fork $dipaco_sets -s train.seed=$seed
	done
	stage "DiPaCo 2x2 on top-2 overlapping k-means shards"
	train dipaco-top2 dipaco-2x2.yaml 2 1 --from "$base" $km2 $model $fork $dipaco_sets
	stage "DiPaCo 2x2 with a path-specific level (last block and head)"
	train dipaco-head dipaco-2x2-head.yaml 2 1 --from "$base" $km1 $model $fork $dipaco_sets
	stage "DiPaCo 2x2 with plain averaging as the outer step"
	train dipaco-avg dipaco-2x2.yaml 2 1 --from "$base" $km1 $model $fork $avg_sets
	stage "DiPaCo 2x2 holding out each shard's validation set (the paper's early stopping)"
	train dipaco-es dipaco-2x2.yaml 2 1 --from "$base" $km1 $model $fork $dipaco_sets -s dipaco.holdout=true
	stage "DiPaCo 2x2 starting from the base's AdamW moments"
	train dipaco-moments dipaco-2x2.yaml 2 1 --from "$base" --moments $km1 $model $fork $dipaco_sets
	stage "DiPaCo 4x2: 8 paths on k-means shards (k = 8), 4 trained each phase (path sampling)"
	train dipaco-sampled dipaco-4x2-sampled.yaml 2 1 --from "$base" $km8 $model $fork $dipaco_sets
}

# resharded NAME TOP: a run re-sharded after phase T/2 by a discriminative router fitted on
# that phase's paths, its schedule restarting there
hp=$(printf 'phase-%04d' "$half")
resharded() {
	nm=$1 top=$2 d=$run/$1 km=$km1
	[ "$top" = 2 ] && km=$km2
	restart="-s train.restart_step=$((half * tau))"
	# shellcheck disable=SC2086
	train $nm dipaco-2x2.yaml 2 1 --from "$base" $km $model $fork $dipaco_sets $restart --until $half
	[ -s "$r/scores-$nm-$hp.safetensors" ] ||
		"$bin/dpc-route" score -q --run "$d" --phase "$half" --prefix $prefix \
			-o "$r/scores-$nm-$hp.safetensors" "$router" >/dev/null
	[ -s "$r/disc-$nm-$hp.safetensors" ] ||
		"$bin/dpc-route" fit -q --scores "$r/scores-$nm-$hp.safetensors" \
			--features "$r/features-router.safetensors" -o "$r/disc-$nm-$hp.safetensors" \
			"$router" >"$r/disc-$nm-$hp.json"
	[ -s "$d/$hp/shards/shards.json" ] ||
		"$bin/dpc-shard" split --run "$d" --after-phase "$half" --top "$top" \
			--router "$r/disc-$nm-$hp.safetensors" --features "$r/features-train.safetensors" \
			"$train" >/dev/null 2>"$d/routing-$hp.txt" || { cat "$d/routing-$hp.txt" >&2; exit 1; }
	# shellcheck disable=SC2086
	train $nm dipaco-2x2.yaml 2 1 --from "$base" $km $model $fork $dipaco_sets $restart
}
stage "DiPaCo 2x2 re-sharded after phase $half by a discriminative router"
resharded dipaco-disc 1
stage "DiPaCo 2x2 as the paper's recipe: k-means, top-2 shards, one discriminative re-sharding"
resharded dipaco-paper 2

routed="flat-moe dipaco-km dipaco-km-seed2 dipaco-km-seed3 dipaco-km-seed4 dipaco-top2 dipaco-head dipaco-avg dipaco-disc dipaco-paper dipaco-es dipaco-moments dipaco-sampled"
stage "scoring the router split with every routed run's final paths"
for c in $routed; do
	[ -s "$r/scores-$c.safetensors" ] ||
		"$bin/dpc-route" score -q --run "$run/$c" --prefix $prefix \
			-o "$r/scores-$c.safetensors" "$router" >/dev/null
done
stage "fitting window routers (every $window tokens) and a discriminative router for k-means"
for c in $routed; do
	[ -s "$r/window-$c.safetensors" ] ||
		"$bin/dpc-route" fit -q --scores "$r/scores-$c.safetensors" --window $window -m "$base" \
			-o "$r/window-$c.safetensors" "$router" >"$r/window-$c.json"
done
[ -s "$r/disc-dipaco-km.safetensors" ] ||
	"$bin/dpc-route" fit -q --scores "$r/scores-dipaco-km.safetensors" \
		--features "$r/features-router.safetensors" -o "$r/disc-dipaco-km.safetensors" \
		"$router" >"$r/disc-dipaco-km.json"
# The paper's window router (its section 7.2.2) beside the linear one, for DiPaCo 2x2: the
# base fine-tuned with a head over the paths, every 64 and 128 tokens, two seeds each (the
# spread of its fit); and a linear one every 128.
trsteps=300
[ "$quick" = 1 ] && trsteps=20
stage "fitting the transformer window routers of DiPaCo 2x2 (every 64 and 128 tokens, 2 seeds, $trsteps steps)"
[ -s "$r/window128-dipaco-km.safetensors" ] ||
	"$bin/dpc-route" fit -q --scores "$r/scores-dipaco-km.safetensors" --window 128 -m "$base" \
		-o "$r/window128-dipaco-km.safetensors" "$router" >"$r/window128-dipaco-km.json"
for W in 64 128; do
	for s in 0 1; do
		f=$r/transformer$W-s$s-dipaco-km
		[ -s "$f.safetensors" ] ||
			"$bin/dpc-route" fit -q --transformer --seed $s --steps $trsteps -t 2 \
				--scores "$r/scores-dipaco-km.safetensors" --window $W -m "$base" \
				-o "$f.safetensors" "$router" >"$f.json"
	done
done

# The document router each run is evaluated with at phase t: its own shards' router (the
# one-path runs need none; DiLoCo's 4 paths are one model after each outer step, so the
# router it gets does not matter).
router_of() {
	case $1 in
	dense-*) echo "" ;;
	dipaco-disc | dipaco-paper) [ "$2" -gt "$half" ] && echo "$r/disc-$1-$hp.safetensors" || echo "$r/kmeans.safetensors" ;;
	dipaco-sampled) echo "$r/kmeans8.safetensors" ;;
	*) echo "$r/kmeans.safetensors" ;;
	esac
}
all="dense-s dense-s-seed2 dense-s-seed3 dense-s-seed4 dense-tm dense-4s dense-4s-halflr diloco $routed"
# The curves: after every T/4-th phase of the forks (dense 4S at the same steps of its run).
cstep=$((phases / 4))
stage "evaluating phases $cstep, $((2 * cstep)), $((3 * cstep)) and $phases once per document on a quarter of the validation split"
for c in $all; do
	off=0
	case $c in dense-4s*) off=$bphases ;; esac
	t=$cstep
	while [ $t -le "$phases" ]; do
		evaluate "$c-curve-$((t + off))" "$run/$c" $((t + off)) "$valq" "$(router_of "$c" $t)"
		t=$((t + cstep))
	done
done
stage "evaluating the last phase: the validation split once per document and every $window tokens, and the unseen text"
for c in $all; do
	w="" last=$phases
	case $c in flat-moe | dipaco-*) w=$r/window-$c.safetensors ;; dense-4s*) last=$all4 ;; esac
	# the paper's early stopping: each path at the phase of its lowest held-out loss
	evx=""
	[ "$c" = dipaco-es ] && evx=--early-stop
	evaluate "$c-final" "$run/$c" "$last" "$val" "$(router_of "$c" "$last")" "$w"
	evaluate "$c-unseen" "$run/$c" "$last" "$unseen" "$(router_of "$c" "$last")"
done
evx=""
evaluate dipaco-km-disc-final "$run/dipaco-km" "$phases" "$val" "$r/disc-dipaco-km.safetensors" \
	"$r/window-dipaco-km.safetensors"
# the early-stopped run's own paths at the last phase: what early stopping changed, alone
evaluate dipaco-es-last "$run/dipaco-es" "$phases" "$val" "$(router_of dipaco-es "$phases")" \
	"$r/window-dipaco-es.safetensors"
# the window routers side by side on the k-means run's paths: once per document, then linear
# and transformer every 64, then every 128 (as reproduce-report.py reads them)
for s in final unseen; do
	in=$val
	[ $s = unseen ] && in=$unseen
	[ -s "$run/eval/dipaco-km-reroute-$s.json" ] ||
		"$bin/dpc-route" eval -q --run "$run/dipaco-km" --phase "$phases" -m "$base" \
			--router "$r/kmeans.safetensors" --window-router "$r/window-dipaco-km.safetensors" \
			--window-router "$r/transformer64-s0-dipaco-km.safetensors" \
			--window-router "$r/transformer64-s1-dipaco-km.safetensors" \
			--window-router "$r/window128-dipaco-km.safetensors" \
			--window-router "$r/transformer128-s0-dipaco-km.safetensors" \
			--window-router "$r/transformer128-s1-dipaco-km.safetensors" \
			--score-from $prefix --json "$run/eval/dipaco-km-reroute-$s.json" "$in" >/dev/null
done
# the base itself, as a run of one phase for dpc-route eval: on the validation and unseen text
for s in final unseen; do
	in=$val
	[ $s = unseen ] && in=$unseen
	[ -s "$run/eval/base-$s.json" ] ||
		"$bin/dpc-route" eval -q --path "$base" -m "$base" --score-from $prefix \
			--json "$run/eval/base-$s.json" "$in" >/dev/null
done

stage "writing $page and its plots"
mkdir -p "$(dirname "$page")"
cmd="sh scripts/reproduce.sh"
[ "$quick" = 1 ] && cmd="$cmd --quick"
d_tau=32 d_phases=16
[ "$quick" = 1 ] && d_tau=16 d_phases=4
[ "$tau" = $d_tau ] || cmd="$cmd --inner-steps $tau"
[ "$phases" = $d_phases ] || cmd="$cmd --phases $phases"
[ "$page" = "$d_page" ] || cmd="$cmd -o $page"
[ -z "$sweep_from" ] || cmd="$cmd --sweep-from $sweep_arg"
[ "$run" = runs/reproduce ] || cmd="$cmd $run"
python3 scripts/reproduce-report.py --run "$run" --command "$cmd" \
	--commit "$(git describe --always --dirty 2>/dev/null || echo unknown)" -o "$page"
echo "reproduce.sh: done in $(($(date +%s) - t0)) s: $page" >&2
