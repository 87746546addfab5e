#!/bin/sh
# One worker of a DiPaCo run under mpirun (scripts/dipaco-train.sh --mpi N starts N of them):
# take the first task of `dpc-outer tasks RUNDIR` whose output is missing and whose inputs
# all exist, claim it, run it, repeat until every output exists. Claiming is mkdir(2) of a
# folder named after the task in RUNDIR/claims/EPOCH: atomic on local and network
# filesystems (NFS included), so two workers never run the same task. EPOCH is new for every
# launch, so the claims of a killed launch do not block the next one; its outputs are never
# half-written (atomic renames), so the next launch redoes only what is missing.
# With UNTIL, only the tasks of phases 1..UNTIL; DEVICE and PRECISION go to dpc-train-path.
#   sh scripts/dipaco-worker.sh RUNDIR EPOCH BINDIR [THREADS [UNTIL [DEVICE [PRECISION]]]]
set -eu
run=$1 epoch=$2 bin=$3 threads=${4:-1} until=${5:-0} device=${6:-cpu} precision=${7:-fp32}
claims=$run/claims/$epoch
mkdir -p "$claims"
tasks=$("$bin/dpc-outer" tasks "$run")
while :; do
	left=0 ran=0
	while read -r kind phase what out deps; do
		[ -e "$run/$out" ] && continue
		[ "$until" -gt 0 ] && [ "$phase" -gt "$until" ] && continue
		left=1
		ready=1
		for d in $deps; do
			[ -e "$run/$d" ] || { ready=0; break; }
		done
		[ $ready = 1 ] || continue
		mkdir "$claims/$kind-$phase-$what" 2>/dev/null || continue
		if [ "$kind" = train ]; then
			"$bin/dpc-train-path" --run "$run" --phase "$phase" --path-index "$what" --quiet \
				--threads "$threads" --device "$device" --precision "$precision" >/dev/null
		else
			"$bin/dpc-outer" step "$run" --phase "$phase" --module "$what" --quiet \
				--threads "$threads" >/dev/null
		fi
		ran=1
		break
	done <<TASKS
$tasks
TASKS
	[ $left = 1 ] || exit 0
	[ $ran = 1 ] || sleep 0.2
done
