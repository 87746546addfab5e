#!/bin/sh
# A whole DiPaCo run: phases 1..T of every path and every module's outer step, as a graph of
# files executed by an existing engine (make -j on one host, mpirun ranks on many). Resumable:
# the same command after a kill, a crash or a preemption redoes only the files that are missing.
#
#   sh scripts/dipaco-train.sh [options] CONFIG RUNDIR TRAIN.tok [VAL.tok]
#     -s KEY=V     override one config value (repeatable; see dpc-config(5))
#     -j N         N tasks at a time on this host (default 2)
#     -t N         threads per task (default 1)
#     --mpi N      N worker ranks under mpirun instead of make; MPIRUN_ARGS adds mpirun
#                  options (a hostfile, say); RUNDIR must be on a filesystem every host sees
#     --seed N     seed of the random shards (default 0)
#     --bin DIR    the programs (default: build/bin of this checkout)
#
# Stages: dpc-outer init (config, phase-0 modules, Makefile), dpc-shard split --random P
# (when RUNDIR/shards has no manifest: routers make other shards, see dpc-shard(1)), the
# validation tokens copied to RUNDIR/val.tok, the task graph, dpc-outer metrics. See
# dpc-outer(1) and dpc-rundir(5).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/../build/bin
jobs=2 threads=1 mpi=0 seed=0 sets=""
usage() { sed -n '6,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	-s) sets="$sets -s $2"; shift 2 ;;
	-j) jobs=$2; shift 2 ;;
	-t) threads=$2; shift 2 ;;
	--mpi) mpi=$2; shift 2 ;;
	--seed) seed=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	-h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "dipaco-train.sh: unknown option '$1'" >&2; usage ;;
	*) break ;;
	esac
done
[ $# -ge 3 ] && [ $# -le 4 ] || usage
config=$1 run=$2 train=$3 val=${4:-}
bin=$(cd "$bin" && pwd)
for p in dpc-outer dpc-shard dpc-train-path; do
	[ -x "$bin/$p" ] || { echo "dipaco-train.sh: $bin/$p is not built (run make)" >&2; exit 1; }
done

# shellcheck disable=SC2086
init=$("$bin/dpc-outer" init -c "$config" $sets --bin "$bin" "$run")
paths=$(echo "$init" | sed 's/.*"paths":\([0-9]*\).*/\1/')
if [ ! -e "$run/shards/shards.json" ]; then
	"$bin/dpc-shard" split -q --random "$paths" --seed "$seed" "$train" "$run/shards" >/dev/null
fi
if [ -n "$val" ] && [ ! -e "$run/val.tok" ]; then
	cp "$val" "$run/val.tok.tmp.$$" && mv "$run/val.tok.tmp.$$" "$run/val.tok"
fi
echo "dipaco-train.sh: $run: $paths paths, $(echo "$init" | sed 's/.*"phases":\([0-9]*\).*/\1/') phases" >&2

if [ "$mpi" -gt 0 ]; then
	# A fresh claim folder per launch: claims of a killed launch are not this launch's.
	epoch=$(date +%Y%m%d-%H%M%S)-$$
	# shellcheck disable=SC2086
	mpirun ${MPIRUN_ARGS:-} -np "$mpi" sh "$here/dipaco-worker.sh" "$run" "$epoch" "$bin" "$threads"
	# The workers end only when every output exists: no claim is needed any more, not even
	# the ones a killed launch left.
	rm -rf "$run/claims"
	"$bin/dpc-outer" metrics "$run" >/dev/null
else
	make -s -C "$run" -j "$jobs" THREADS="$threads" BIN="$bin" >/dev/null
fi
"$bin/dpc-outer" metrics --table "$run"
