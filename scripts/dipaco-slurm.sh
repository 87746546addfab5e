#!/bin/sh
# A DiPaCo run's task graph submitted to Slurm, for clusters of preemptible machines (the
# paper's backup pool): Slurm is the scheduler, this script only translates the graph.
#
#   sh scripts/dipaco-slurm.sh RUNDIR [options]
#     --bin DIR        the programs, on a path every node sees (default: build/bin here)
#     --threads N      threads (and Slurm CPUs) per task (default 1)
#     --partition P    the Slurm partition (default: the cluster's default)
#     --wait           wait until the metrics job ends; exit 0 when it COMPLETED
#     --dry-run        print the sbatch commands, with JOBn for the job ids; touch nothing
#
# RUNDIR is made as for scripts/dipaco-train.sh (dpc-outer init, dpc-shard split) and must be
# on a filesystem every node sees. Each line of `dpc-outer tasks RUNDIR` becomes a job running
# what the run's Makefile runs (dpc-train-path --run, dpc-outer step), then one job runs
# dpc-outer metrics. Jobs log to RUNDIR/slurm/%x-%j.out; RUNDIR/slurm/jobs lists them.
#
# The graph, exactly: a job has --dependency=afterok on the jobs that make its inputs and on
# nothing else, so path p of phase t+1 starts once the modules it uses (and its own phase-t
# checkpoint) exist, not after the whole phase. An input that exists already gives no
# dependency, and a task whose output exists is not submitted: every output is written
# atomically, so an existing output is a finished task, and running this script again after a
# failure submits only what is missing (resume).
#
# Job arrays: the tasks whose inputs all exist (phase 1's training, or whatever a resumed run
# can start at once) have no dependency, and those of one kind and phase become one array
# (train: the array index is the path). Later tasks are one job each: Slurm gives an array one
# dependency list for all its elements, and aftercorr only ties element i to element i of
# another array, while path p of phase t+1 needs modules whose indices are not p (lower.0 is
# made from paths 0 and 1), and module m needs the paths that use it. An array per phase would
# therefore coarsen the graph into a barrier per phase, which DiPaCo avoids. Dependencies on
# an array's element name it as ARRAYID_INDEX, which Slurm 22.05 accepts.
#
# Preemption: every job has --requeue, so a job whose node is lost (or that the scheduler
# preempts, or `scontrol requeue`) goes back to the queue and reruns from scratch; its output
# had not been renamed into place, so the rerun is clean, and the jobs after it just wait.
# A job that fails (non-zero exit) cancels the jobs that depend on it (--kill-on-invalid-dep),
# so the queue empties instead of holding jobs that can never run; run the script again to
# resume. On such a resubmission, the jobs of the previous one (RUNDIR/slurm/jobs) that still
# run are kept, and the new jobs depend on them; those still pending are cancelled and
# submitted again.
set -eu
me=dipaco-slurm.sh
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/../build/bin
threads=1 partition="" wait=0 dry=0 run=""
usage() { sed -n '5,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "$me: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
	case $1 in
	--bin) [ $# -ge 2 ] || usage; bin=$2; shift 2 ;;
	--threads) [ $# -ge 2 ] || usage; threads=$2; shift 2 ;;
	--partition) [ $# -ge 2 ] || usage; partition=$2; shift 2 ;;
	--wait) wait=1; shift ;;
	--dry-run) dry=1; shift ;;
	-h|--help) sed -n '2,42p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "$me: unknown option '$1'" >&2; usage ;;
	*) [ -z "$run" ] || usage; run=$1; shift ;;
	esac
done
[ -n "$run" ] || usage
case $threads in ''|*[!0-9]*|0*) echo "$me: --threads wants a positive integer, not '$threads'" >&2; exit 2 ;; esac
[ -d "$run" ] || die "cannot open run directory '$run'"
run=$(cd "$run" && pwd)
[ -e "$run/config.yaml" ] || die "'$run' is not a run directory (no config.yaml; see dpc-outer init)"
[ -d "$bin" ] || die "cannot open '$bin'"
bin=$(cd "$bin" && pwd)
for p in dpc-outer dpc-train-path; do
	[ -x "$bin/$p" ] || die "$bin/$p is not built (run make)"
done
if [ $dry = 0 ]; then
	for p in sbatch squeue scancel scontrol; do
		command -v $p >/dev/null 2>&1 || die "no '$p': is Slurm installed (scripts/slurm-one-node.sh)?"
	done
fi
tasks=$("$bin/dpc-outer" tasks "$run") || exit 1

# q WORD: WORD quoted for sh, for the --wrap command lines.
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dipaco-slurm.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
record=$run/slurm/jobs

# ---- the previous submission: keep its running jobs, cancel its pending ones ----------------
: >"$scratch/adopt"
if [ $dry = 0 ] && [ -s "$record" ]; then
	squeue -h -r -o '%i %T' >"$scratch/queue" || die "squeue failed"
	# "REF OUT" of the record -> the running ones to adopt, the pending ones to cancel
	awk -v adopt="$scratch/adopt" -v cancel="$scratch/cancel" '
		NR == FNR { state[$1] = $2; next }
		($1 in state) {
			s = state[$1]
			if (s == "RUNNING" || s == "CONFIGURING" || s == "COMPLETING") {
				if ($2 != "metrics.jsonl") print $1, $2 >adopt
			} else print $1 >cancel
		}' "$scratch/queue" "$record"
	if [ -s "$scratch/cancel" ]; then
		# shellcheck disable=SC2046
		scancel $(cat "$scratch/cancel") 2>/dev/null || true
		echo "$me: cancelled $(wc -l <"$scratch/cancel") pending jobs of the previous submission"
	fi
fi

# ---- the plan ---------------------------------------------------------------------------------
# After the queue query, so that a job that ended meanwhile is seen through its output.
(cd "$run" && find . -type f ! -name '*.tmp.*' ! -name '*.part' | sed 's|^\./||') >"$scratch/exist"
# Lines, in submission order:
#   array KIND PHASE I:WHAT...   tasks I (line numbers of the task list) with no dependency
#   job I KIND PHASE WHAT DEP... task I after the tasks DEP (line numbers)
#   adopt I REF                  task I is the running job REF of the previous submission
#   metrics DEP...               the final modules' tasks
printf '%s\n' "$tasks" | awk -v exist="$scratch/exist" -v adopt="$scratch/adopt" '
	BEGIN {
		while ((getline f <exist) > 0) have[f] = 1
		while ((getline l <adopt) > 0) { split(l, a, " "); adopted[a[2]] = a[1] }
	}
	{
		n++; kind[n] = $1; phase[n] = $2; what[n] = $3; out[n] = $4; maker[$4] = n
		if ($2 > last) last = $2
		deps[n] = ""
		if ($4 in have) { done[n] = 1; next }
		for (i = 5; i <= NF; i++) {
			if ($i in have) continue
			if (!($i in maker)) {
				printf "missing %s\n", $i; bad = 1; continue
			}
			deps[n] = deps[n] " " maker[$i]
		}
	}
	END {
		if (bad) exit 0
		for (i = 1; i <= n; i++) {
			if (done[i]) continue
			if (out[i] in adopted) { print "adopt", i, adopted[out[i]]; continue }
			if (deps[i] == "") {
				k = kind[i] " " phase[i]
				if (!(k in group)) order[++ng] = k
				group[k] = group[k] " " i ":" what[i]
			}
		}
		for (g = 1; g <= ng; g++) print "array", order[g] group[order[g]]
		for (i = 1; i <= n; i++)
			if (!done[i] && !(out[i] in adopted) && deps[i] != "")
				print "job", i, kind[i], phase[i], what[i] deps[i]
		m = ""; left = 0
		for (i = 1; i <= n; i++) {
			if (!done[i]) left = 1
			if (kind[i] == "outer" && phase[i] == last && !done[i]) m = m " " i
		}
		if (left || !("metrics.jsonl" in have)) print "metrics" m
	}' >"$scratch/plan"
if grep -q '^missing ' "$scratch/plan"; then
	die "input '$(sed -n 's/^missing //p' "$scratch/plan" | head -n 1)' does not exist and no task makes it (shards: dpc-shard split)"
fi
if [ ! -s "$scratch/plan" ]; then
	echo "$me: nothing to submit: every task's output and metrics.jsonl exist"
	exit 0
fi

# ---- submission -------------------------------------------------------------------------------
train="$(q "$bin/dpc-train-path") --run $(q "$run") --quiet --threads $threads"
outer="$(q "$bin/dpc-outer") step $(q "$run") --quiet --threads $threads"
[ $dry = 1 ] || mkdir -p "$run/slurm"
: >"$scratch/record"
fake=0 njobs=0 narrays=0
# submit NAME DEPREFS SBATCH-ARGS...: one sbatch; sets $jid
submit() {
	name=$1 dep=$2; shift 2
	set -- --parsable --requeue --kill-on-invalid-dep=yes --open-mode=append \
		--job-name="$name" --chdir="$run" --output="$run/slurm/%x-%j.out" \
		--cpus-per-task="$threads" ${partition:+"--partition=$partition"} \
		${dep:+"--dependency=afterok$dep"} "$@"
	if [ $dry = 1 ]; then
		fake=$((fake + 1)); jid=JOB$fake
		# shellcheck disable=SC2016
		printf '%s=$(sbatch' "$jid"
		for a in "$@"; do printf ' %s' "$(q "$a")"; done
		printf ')\n'
	else
		jid=$(sbatch "$@") || die "sbatch failed for job '$name'"
		jid=${jid%%;*}
	fi
	njobs=$((njobs + 1))
}
# deprefs I...: ":REF:REF..." for the jobs of tasks I
deprefs() {
	r=""
	for i in "$@"; do eval "r=\$r:\$ref_$i"; done
	printf '%s' "$r"
}
while read -r what a b rest; do
	case $what in
	adopt)
		eval "ref_$a=\$b"
		o=$(printf '%s\n' "$tasks" | sed -n "${a}p" | cut -d' ' -f4)
		echo "$b $o" >>"$scratch/record"
		echo "$b	(running, kept)	$(printf '%s\n' "$tasks" | sed -n "${a}p" | cut -d' ' -f1-3)"
		;;
	array)
		kind=$a phase=$b
		# shellcheck disable=SC2086
		set -- $rest
		if [ $# = 1 ]; then
			i=${1%%:*} w=${1#*:}
			if [ "$kind" = train ]; then
				submit "train-$phase-$w" "" --wrap="exec $train --phase $phase --path-index $w"
			else
				submit "outer-$phase-$w" "" --wrap="exec $outer --phase $phase --module $(q "$w")"
			fi
			eval "ref_$i=\$jid"
			echo "$jid $(printf '%s\n' "$tasks" | sed -n "${i}p" | cut -d' ' -f4)" >>"$scratch/record"
			echo "$jid	$kind $phase $w"
			continue
		fi
		if [ "$kind" = train ]; then
			# the array index is the path number
			idx=$(for t in "$@"; do printf '%s\n' "${t#*:}"; done | paste -sd, -)
			submit "train-$phase" "" --array="$idx" \
				--wrap="exec $train --phase $phase --path-index \$SLURM_ARRAY_TASK_ID"
		else
			# the array index is the module's position in this list
			names="" idx=""
			k=0
			for t in "$@"; do names="$names $(q "${t#*:}")"; idx="$idx${idx:+,}$k"; k=$((k + 1)); done
			submit "outer-$phase" "" --array="$idx" \
				--wrap="set --$names; shift \$SLURM_ARRAY_TASK_ID; exec $outer --phase $phase --module \"\$1\""
		fi
		narrays=$((narrays + 1))
		k=0
		for t in "$@"; do
			i=${t%%:*} w=${t#*:}
			if [ "$kind" = train ]; then e=$w; else e=$k; fi
			eval "ref_$i=\${jid}_\$e"
			echo "${jid}_$e $(printf '%s\n' "$tasks" | sed -n "${i}p" | cut -d' ' -f4)" >>"$scratch/record"
			echo "${jid}_$e	$kind $phase $w"
			k=$((k + 1))
		done
		;;
	job)
		i=$a kind=$b
		# shellcheck disable=SC2086
		set -- $rest
		phase=$1 w=$2; shift 2
		dep=$(deprefs "$@")
		if [ "$kind" = train ]; then
			submit "train-$phase-$w" "$dep" --wrap="exec $train --phase $phase --path-index $w"
		else
			submit "outer-$phase-$w" "$dep" --wrap="exec $outer --phase $phase --module $(q "$w")"
		fi
		eval "ref_$i=\$jid"
		echo "$jid $(printf '%s\n' "$tasks" | sed -n "${i}p" | cut -d' ' -f4)" >>"$scratch/record"
		echo "$jid	$kind $phase $w	afterok$dep"
		;;
	metrics)
		# shellcheck disable=SC2086
		dep=$(deprefs $a $b $rest)
		submit metrics "$dep" --wrap="exec $(q "$bin/dpc-outer") metrics $(q "$run")"
		metrics=$jid
		echo "$jid metrics.jsonl" >>"$scratch/record"
		echo "$jid	metrics	${dep:+afterok$dep}"
		;;
	esac
done <"$scratch/plan"

if [ $dry = 1 ]; then
	echo "$me: dry run: $njobs sbatch commands, arrays: $narrays; nothing submitted"
	exit 0
fi
cp "$scratch/record" "$record.tmp.$$" && mv "$record.tmp.$$" "$record"
echo "$me: submitted $njobs jobs, arrays: $narrays; the metrics job is $metrics"
echo "$me: watch: squeue -u $(id -un); logs: $run/slurm/; wait: while squeue -h -j $metrics | grep -q .; do sleep 10; done; scontrol show job $metrics | grep JobState"
[ $wait = 1 ] || exit 0

# ---- --wait -----------------------------------------------------------------------------------
while :; do
	state=$(scontrol show job "$metrics" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1)
	case $state in
	PENDING|RUNNING|CONFIGURING|COMPLETING|REQUEUED|REQUEUE_HOLD|REQUEUE_FED|SUSPENDED|RESIZING) sleep 5 ;;
	*) break ;;
	esac
done
echo "$me: metrics job $metrics: ${state:-gone from the queue}"
[ "$state" = COMPLETED ] || { echo "$me: run '$me $run' again to resume" >&2; exit 1; }
