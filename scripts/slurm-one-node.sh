#!/bin/sh
# A one-node Slurm cluster on this Debian 12 machine, for trying scripts/dipaco-slurm.sh (and
# test/slurm/demo.sh) without a real cluster. As root:
#
#   sh scripts/slurm-one-node.sh          install slurm-wlm and munge, configure, start
#   sh scripts/slurm-one-node.sh --stop   stop the daemons this script started
#
# It installs the packages (apt-get, only the missing ones), makes a munge key if there is
# none, writes /etc/slurm/slurm.conf for this host (one node, partition "debug", every CPU of
# nproc, 80% of the memory; proctrack/linuxproc and task/none because a container has no
# cgroups to give; JobRequeue=1 so that jobs come back to the queue when preempted), and starts
# munged, slurmctld and slurmd directly, in the background (no systemd here), each under
# start-stop-daemon with a pid file in /run/slurm-one-node, then waits until sinfo shows the
# node up, resuming it if it came up down. Running it again changes nothing on a machine that
# it has set up; a slurm.conf that it did not write is left alone. Logs: /var/log/slurm.
set -eu
me=slurm-one-node.sh
piddir=/run/slurm-one-node
conf=/etc/slurm/slurm.conf
mark="# written by scripts/slurm-one-node.sh"
die() { echo "$me: $*" >&2; exit 1; }

case ${1:-} in
-h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
--stop|"") ;;
*) echo "$me: unknown option '$1'" >&2; sed -n '5,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || die "must run as root"

# stop NAME EXEC: stop the daemon whose pid this script recorded, if it is still that program.
stop() {
	[ -e "$piddir/$1.pid" ] || return 0
	start-stop-daemon --stop --quiet --oknodo --retry TERM/10/KILL/5 \
		--pidfile "$piddir/$1.pid" --exec "$2" && rm -f "$piddir/$1.pid"
	echo "$me: stopped $1"
}
if [ "${1:-}" = --stop ]; then
	stop slurmd /usr/sbin/slurmd-wlm
	stop slurmctld /usr/sbin/slurmctld-wlm
	stop munged /usr/sbin/munged
	exit 0
fi

# ---- packages -------------------------------------------------------------------------------
missing=""
for p in slurm-wlm munge; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "$me: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	# shellcheck disable=SC2086
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $missing >/dev/null
fi

# ---- munge key ------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
	mungekey --create --keyfile /etc/munge/munge.key
	echo "$me: wrote /etc/munge/munge.key"
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

# ---- slurm.conf -----------------------------------------------------------------------------
host=$(hostname -s)
cpus=$(nproc)
# Less than the machine has: slurmd marks a node that reports less memory than RealMemory as
# invalid, and what the kernel reports moves a little between boots.
mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
slurmuser=slurm
id slurm >/dev/null 2>&1 || slurmuser=root
new=$(cat <<EOF
$mark
ClusterName=onenode
SlurmctldHost=$host
SlurmUser=$slurmuser
AuthType=auth/munge
# a requeued (preempted) job may start again after cred_expire seconds (default 120)
AuthInfo=cred_expire=30
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
ReturnToService=2
# keep finished jobs visible to squeue and scontrol for 10 minutes (there is no accounting)
MinJobAge=600
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
if [ ! -e "$conf" ]; then
	printf '%s\n' "$new" >"$conf.tmp.$$" && mv "$conf.tmp.$$" "$conf"
	echo "$me: wrote $conf ($host, $cpus CPUs, ${mem} MB)"
elif ! head -n 1 "$conf" | grep -qxF "$mark"; then
	echo "$me: $conf was not written by this script: using it as it is" >&2
elif [ "$(cat "$conf")" != "$new" ]; then
	printf '%s\n' "$new" >"$conf.tmp.$$" && mv "$conf.tmp.$$" "$conf"
	echo "$me: rewrote $conf ($host, $cpus CPUs, ${mem} MB); if Slurm was running, run --stop and this again"
fi

mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge "$piddir"
chown "$slurmuser:" /var/spool/slurmctld /var/log/slurm
chown munge:munge /run/munge
chmod 0755 /run/munge

# ---- daemons --------------------------------------------------------------------------------
# start NAME EXEC [--chuid USER] -- ARGS: start EXEC in the foreground mode of the daemon,
# backgrounded by start-stop-daemon, unless the one recorded in our pid file still runs.
start() {
	name=$1 exe=$2; shift 2
	if start-stop-daemon --status --pidfile "$piddir/$name.pid" --exec "$exe"; then
		return 0
	fi
	start-stop-daemon --start --quiet --background --make-pidfile --pidfile "$piddir/$name.pid" \
		--exec "$exe" "$@"
	echo "$me: started $name (pid $(cat "$piddir/$name.pid"))"
}
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	start munged /usr/sbin/munged --chuid munge -- --foreground
	i=0
	until munge -n 2>/dev/null | unmunge >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -lt 50 ] || die "munged does not answer (see /var/log/munge)"
		sleep 0.2
	done
fi
start slurmctld /usr/sbin/slurmctld-wlm -- -D
start slurmd /usr/sbin/slurmd-wlm -- -D

# ---- wait for the node ----------------------------------------------------------------------
i=0
while :; do
	state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null | head -n 1) || state=""
	case $state in
	idle*|mix*|alloc*|comp*) break ;;
	down*|drain*|drng*|fail*|inval*)
		scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
	esac
	i=$((i + 1))
	[ $i -lt 60 ] || die "node '$host' is '${state:-unknown}' after 60 s (see /var/log/slurm)"
	sleep 1
done
echo "$me: node $host is $state; partition debug; try: sinfo; squeue"
