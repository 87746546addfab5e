#!/bin/sh
# Demonstration, by hand, not part of `make test`: a DiPaCo run submitted to Slurm with
# scripts/dipaco-slurm.sh survives preemption and a failed job, and ends with the same final
# modules, bit for bit, as the same run under make -j2.
#
#   sh scripts/slurm-one-node.sh      (as root, once: a one-node Slurm on this machine)
#   sh test/slurm/demo.sh [DIR]       (DIR: a fresh folder for the runs; default: mktemp)
#
# The 2x2 run of test/sh/t-dipaco-mpi.sh (tiny model, 3 phases of 30 steps) is made twice.
# Through Slurm: one running phase-1 training job is preempted (scontrol requeue: it goes back
# to the queue and reruns), one running phase-2 training job's process is killed with SIGKILL
# (the job fails and Slurm cancels what depends on it), then dipaco-slurm.sh is run again and
# submits only what is missing. Prints what it did, then PASS (exit 0) or FAIL (exit 1).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BIN=${BIN:-$root/build/bin}
BIN=$(cd "$BIN" && pwd)
fail() { echo "demo: $*"; echo FAIL; exit 1; }
say() { echo "demo: $*"; }
command -v sbatch >/dev/null 2>&1 || fail "no sbatch: run scripts/slurm-one-node.sh first"
sinfo -h -o %t 2>/dev/null | grep -Eq 'idle|mix|alloc' || fail "no Slurm node up: run scripts/slurm-one-node.sh"
if [ $# -ge 1 ]; then
	dir=$1; mkdir -p "$dir"
else
	dir=$(mktemp -d "${TMPDIR:-/tmp}/dpc-slurm-demo.XXXXXX")
fi
dir=$(cd "$dir" && pwd)
cd "$dir"
if [ -e viamake ] || [ -e viaslurm ]; then fail "'$dir' holds runs already: give a fresh folder"; fi
say "working in $dir"

# ---- the run, twice --------------------------------------------------------------------------
# shellcheck source=test/sh/corpus.sh
. "$root/test/sh/corpus.sh"
make_corpus c.jsonl 80
"$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d >/dev/null
setup() {
	"$BIN/dpc-outer" init -c "$root/configs/dipaco-2x2.yaml" -s model.n_embd=64 -s model.n_head=2 \
		-s model.seq_len=32 -s train.batch_size=2 -s train.warmup_steps=2 \
		-s train.eval_batches=1 -s dipaco.phases=3 -s dipaco.inner_steps=30 \
		-s train.steps=90 --bin "$BIN" "$1" >/dev/null
	"$BIN/dpc-shard" split -q --random 4 --seed 0 d/train.tok "$1/shards" >/dev/null
	cp d/val.tok "$1/val.tok"
}
setup viamake
setup viaslurm
t0=$(date +%s)
make -s -C viamake -j2 THREADS=1 BIN="$BIN" >make.out 2>&1 || { cat make.out; fail "the make run failed"; }
say "reference: make -j2 ran the 2x2 run (3 phases) in $(($(date +%s) - t0)) s"

# ---- through Slurm ---------------------------------------------------------------------------
t0=$(date +%s)
sh "$root/scripts/dipaco-slurm.sh" viaslurm --bin "$BIN" >submit1.out 2>&1 || { cat submit1.out; fail "submission failed"; }
metrics1=$(sed -n 's/.*the metrics job is \([0-9]*\).*/\1/p' submit1.out)
[ -n "$metrics1" ] || { cat submit1.out; fail "no metrics job in the submission's output"; }
say "submitted: $(tail -n 2 submit1.out | head -n 1 | sed 's/^dipaco-slurm.sh: //')"
sed -n 's/^\([0-9_]*\)	/    \1	/p' submit1.out | head -n 7
echo "    ..."

# waitfor SECONDS CMD...: poll CMD every 0.1 s until it succeeds
waitfor() {
	n=$(($1 * 10)); shift
	while [ $n -gt 0 ]; do
		"$@" && return 0
		sleep 0.1; n=$((n - 1))
	done
	return 1
}
# freeze PHASE: catch a training task of PHASE of this run while it trains and stop it
# (SIGSTOP), so that it is surely mid-way when it is preempted or killed (a task of this tiny
# model trains in a fraction of a second); sets path, pid, job (its Slurm job id) and ref.
freeze() {
	pat="dpc-train-path --run $dir/viaslurm --quiet --threads 1 --phase $1 --path-index "
	n=3000
	while [ $n -gt 0 ]; do
		for pid in $(pgrep -f -- "$pat" || true); do
			path=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed 's/.* --path-index \([0-9]*\).*/\1/')
			[ -n "$path" ] || continue
			[ -e "viaslurm/phase-000$1/paths/path-00$path.jsonl.part" ] || continue
			kill -STOP "$pid" || continue
			out=phase-000$1/paths/path-00$path.safetensors
			ref=$(awk -v o="$out" '$2 == o { print $1 }' viaslurm/slurm/jobs)
			job=$(squeue -h -r -o '%i %A' | awk -v r="$ref" '$1 == r { print $2 }')
			# the process is the job's: scontrol listpids says so
			scontrol listpids "$job" | awk -v p="$pid" 'NR > 1 && $1 == p { f = 1 } END { exit !f }' \
				|| fail "pid $pid is not one of job $job's ($ref)"
			return 0
		done
		sleep 0.01; n=$((n - 1))
	done
	fail "no training task of phase $1 seen running"
}

# A phase-1 training job, preempted mid-way: back to the queue, rerun later from scratch.
freeze 1
scontrol requeue "$job" || fail "scontrol requeue $job failed"
pre=$ref preid=$job prepath=$path
say "preempted job $pre (phase 1, path $prepath, pid $pid mid-way) with scontrol requeue $preid"

# A phase-2 training job, killed mid-way: SIGKILL to its process (a PID of the job's
# scontrol listpids), so the job fails and Slurm cancels the jobs after it.
freeze 2
victim=$ref
prestate=$(scontrol show job "$preid" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
kill -KILL "$pid"
say "killed job $victim (phase 2, path $path) with SIGKILL to pid $pid from scontrol listpids $job"
say "  (it ran while the preempted phase-1 job was $prestate: no barrier between phases)"

# The first submission ends without its metrics job.
done1() {
	s=$(scontrol show job "$metrics1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
	case $s in PENDING|RUNNING|COMPLETING|CONFIGURING) return 1 ;; esac
}
waitfor 600 done1 || fail "the first submission's metrics job never ended"
# and the preempted job, requeued, ran again by itself and succeeded
requeued() {
	p=$(scontrol show job "$preid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
	case $p in PENDING|RUNNING|COMPLETING|CONFIGURING|REQUEUED) return 1 ;; esac
}
waitfor 300 requeued || fail "the preempted job $pre never ran again"
[ "$p" = COMPLETED ] || fail "the preempted job $pre ended $p"
victim_state=$(squeue -h -t all -j "$victim" -o %T 2>/dev/null || true)
say "first submission: killed job $victim $victim_state, metrics job $metrics1 $s (its dependencies cancelled);" \
	"preempted job $pre $p after $(scontrol show job "$preid" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p') restart"
say "its log: $(grep -h 'JOB REQUEUE' viaslurm/slurm/train-1-"$preid".out | sed 's/^.*error: //')"
n=0
for f in viaslurm/phase-000[1-9]/paths/*.safetensors viaslurm/phase-000[1-9]/modules/*.safetensors; do
	[ -e "$f" ] && n=$((n + 1))
done
say "task outputs on disk after it: $n of 24"

# Resubmission: only what is missing.
sh "$root/scripts/dipaco-slurm.sh" viaslurm --bin "$BIN" --wait >submit2.out 2>&1 || {
	cat submit2.out; fail "the resubmission did not complete"; }
say "resubmitted: $(grep -c '	' submit2.out) jobs listed ($(grep -c 'running, kept' submit2.out || true) kept running), $(grep 'submitted' submit2.out | sed 's/^dipaco-slurm.sh: //')"
say "$(tail -n 1 submit2.out | sed 's/^dipaco-slurm.sh: //')"
say "Slurm run: $(($(date +%s) - t0)) s in all"
again=$(sh "$root/scripts/dipaco-slurm.sh" viaslurm --bin "$BIN" 2>&1)
say "a third submission: ${again#dipaco-slurm.sh: }"

# ---- the same bits -------------------------------------------------------------------------
bad=0
for m in lower.0 lower.1 upper.0 upper.1; do
	f=phase-0003/modules/$m.safetensors
	if cmp -s "viamake/$f" "viaslurm/$f"; then say "same bits: $f"; else say "DIFFERENT: $f"; bad=1; fi
done
[ $bad = 0 ] || fail "the Slurm run's final modules differ from make's"
"$BIN/dpc-outer" metrics --table viaslurm | sed 's/^/    /'
echo PASS
