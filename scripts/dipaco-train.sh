#!/bin/sh
# A whole DiPaCo run: phases 1..T of every path and every module's outer step, as a graph of
# files executed by an existing engine (make -j on one host, mpirun ranks on many). Resumable:
# the same command after a kill, a crash or a preemption redoes only the files that are missing.
#
#   sh scripts/dipaco-train.sh [options] CONFIG RUNDIR TRAIN.tok [VAL.tok]
#     -s KEY=V     override one config value (repeatable; see dpc-config(5))
#     -j N         N tasks at a time on this host (default 2)
#     -t N         threads per task (default 1)
#     --device D   where the paths train: cpu (default) or cuda (dpc-train-path --device;
#                  with -j N, N tasks share the device)
#     --precision P  fp32 (default), tf32 (cuda), bf16 (cuda; cpu with oneDNN, AVX512_BF16)
#     --mpi N      N worker ranks under mpirun instead of make; MPIRUN_ARGS adds mpirun
#                  options (a hostfile, say); RUNDIR must be on a filesystem every host sees
#     --seed N     seed of the random shards (default 0)
#     --router R   the first shards routed by the document router R (dpc-route kmeans or
#                  fit) instead of drawn at random; with --features F, the training tokens'
#                  features, and --top K (1 or 2); its report goes to RUNDIR/routing.txt
#     --from CKPT  every module starts from this trained model (dpc-outer init --from)
#     --moments    with --from: the paths start from its AdamW moments too (init --moments)
#     --until T    stop after phase T (to re-shard the run with a router fitted on phase
#                  T's paths, dpc-route(1); the same command without --until goes on)
#     --bin DIR    the programs (default: build/bin of this checkout)
#     -q           no progress lines (by default one on stderr as tasks finish)
#
# Stages: dpc-outer init (config, phase-0 modules, Makefile), dpc-shard split --random P
# (when RUNDIR/shards has no manifest: routers make other shards, see dpc-shard(1)), the
# validation tokens copied to RUNDIR/val.tok, the task graph, dpc-outer metrics. See
# dpc-outer(1) and dpc-rundir(5).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/../build/bin
jobs=2 threads=1 mpi=0 seed=0 until=0 quiet=0 sets="" device=cpu precision=fp32 from=""
moments="" router="" features="" top=1
usage() { sed -n '6,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	-s) sets="$sets -s $2"; shift 2 ;;
	-j) jobs=$2; shift 2 ;;
	-t) threads=$2; shift 2 ;;
	--device) device=$2; shift 2 ;;
	--precision) precision=$2; shift 2 ;;
	--mpi) mpi=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--router) router=$2; shift 2 ;;
	--features) features=$2; shift 2 ;;
	--top) top=$2; shift 2 ;;
	--from) from=$2; shift 2 ;;
	--moments) moments=--moments; shift ;;
	--until) until=$2; shift 2 ;;
	-q|--quiet) quiet=1; shift ;;
	--bin) bin=$2; shift 2 ;;
	-h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "dipaco-train.sh: unknown option '$1'" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -ge 3 ] && [ $# -le 4 ] || usage
if [ -n "$router" ] && [ -z "$features" ]; then
	echo "dipaco-train.sh: --router needs --features F (the training tokens' features)" >&2
	exit 2
fi
config=$1 run=$2 train=$3 val=${4:-}
bin=$(cd "$bin" && pwd)
for p in dpc-outer dpc-shard dpc-train-path; do
	[ -x "$bin/$p" ] || { echo "dipaco-train.sh: $bin/$p is not built (run make)" >&2; exit 1; }
done

# shellcheck disable=SC2086
init=$("$bin/dpc-outer" init -c "$config" $sets ${from:+--from "$from"} $moments --bin "$bin" \
	"$run")
paths=$(echo "$init" | sed 's/.*"paths":\([0-9]*\).*/\1/')
# the first phases' shards, unless the run has them: as many as paths, where the run keeps them
if [ "$(echo "$init" | sed 's/.*"shards":\([0-9]*\).*/\1/')" = 0 ]; then
	if [ -n "$router" ]; then
		"$bin/dpc-shard" split --run "$run" --router "$router" --features "$features" \
			--top "$top" "$train" >/dev/null 2>"$run/routing.txt" ||
			{ cat "$run/routing.txt" >&2; exit 1; }
		[ "$quiet" = 1 ] || cat "$run/routing.txt" >&2
	else
		"$bin/dpc-shard" split -q --run "$run" --seed "$seed" "$train" >/dev/null
	fi
fi
if [ -n "$val" ] && [ ! -e "$run/val.tok" ]; then
	cp "$val" "$run/val.tok.tmp.$$" && mv "$run/val.tok.tmp.$$" "$run/val.tok"
fi
phases=$(echo "$init" | sed 's/.*"phases":\([0-9]*\).*/\1/')
modules=$(echo "$init" | sed 's/.*"modules":\([0-9]*\).*/\1/')
echo "dipaco-train.sh: $run: $paths paths, $modules modules, $phases phases" >&2

# A plain progress line on stderr whenever a task finishes (at most every 10 s), terminal or
# log file alike: tasks done of the phases asked for, and the time since the start.
last=$phases
[ "$until" -gt 0 ] && [ "$until" -lt "$phases" ] && last=$until
# (the task graph's count: with dipaco.paths_per_phase a phase trains only some paths)
tasks=$("$bin/dpc-outer" tasks "$run") || exit 1
total=$(printf '%s\n' "$tasks" | awk -v last="$last" '$2 <= last' | wc -l)
total=$((total)) start=$(date +%s)
count_done() {
	n=0 t=1
	while [ "$t" -le "$last" ]; do
		d=$(printf '%s/phase-%04d' "$run" "$t")
		for f in "$d"/paths/*.safetensors "$d"/modules/*.safetensors; do
			[ -e "$f" ] && n=$((n + 1))
		done
		t=$((t + 1))
	done
	echo "$n"
}
watch() {
	prev=-1
	while :; do
		n=$(count_done)
		if [ "$n" != "$prev" ]; then
			echo "dipaco-train.sh: $n/$total tasks done, $(($(date +%s) - start)) s" >&2
			prev=$n
		fi
		sleep 10 </dev/null >/dev/null 2>&1
	done
}
watcher=
if [ "$quiet" = 0 ]; then
	watch &
	watcher=$!
	trap '[ -z "$watcher" ] || kill "$watcher" 2>/dev/null || true' EXIT
	trap 'exit 130' INT TERM
fi

if [ "$mpi" -gt 0 ]; then
	# A fresh claim folder per launch: claims of a killed launch are not this launch's.
	epoch=$(date +%Y%m%d-%H%M%S)-$$
	# shellcheck disable=SC2086
	mpirun ${MPIRUN_ARGS:-} -np "$mpi" sh "$here/dipaco-worker.sh" "$run" "$epoch" "$bin" \
		"$threads" "$until" "$device" "$precision"
	# The workers end only when every output exists: no claim is needed any more, not even
	# the ones a killed launch left.
	rm -rf "$run/claims"
	[ "$until" -gt 0 ] || "$bin/dpc-outer" metrics "$run" >/dev/null
else
	target=all
	[ "$until" -gt 0 ] && target=through-$until
	make -s -C "$run" -j "$jobs" THREADS="$threads" BIN="$bin" DEVICE="$device" \
		PRECISION="$precision" "$target" >/dev/null
fi
[ -z "$watcher" ] || { kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null || true; }
watcher=
echo "dipaco-train.sh: $(count_done)/$total tasks done, $(($(date +%s) - start)) s" >&2
"$bin/dpc-outer" metrics --table "$run"
