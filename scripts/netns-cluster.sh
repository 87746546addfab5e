#!/bin/sh
# netns-cluster.sh - this machine as an emulated cluster: H hosts of R ranks, each host a
# network namespace with its own UTS namespace (hostname), joined by shaped links to a
# switch, so that Open MPI sees H nodes: shared memory between the ranks of a host, TCP over
# a rate-limited link between hosts. The topology 2DH and the strategy dictionary exist for
# (Tutel, arXiv 2206.03382, sec. 3.4.5), and a DiPaCo run with a host that fails, measured on
# the real engine (mpirun) with no networking of ours.
#
#   sh scripts/netns-cluster.sh up [options]      make the cluster (cleaning a stale one first)
#     -H, --hosts N     hosts (default 2, at most 64)
#     -R, --ranks N     ranks per host: the slots of each host in the hostfile (default 2)
#     --link RATE       each host's link, both ways, as tc writes rates: 100mbit, 1gbit, 2.5gbit
#                       (default 1gbit)
#     --mtu N           the links' MTU (default 9000, as data-centre fabrics; 1500 costs the
#                       kernel six times the packets)
#   sh scripts/netns-cluster.sh run [--host I] -- CMD [ARG]...
#                       CMD inside host I (default 0) with Open MPI told about the cluster
#                       (OMPI_MCA_* in the environment: the hostfile, the launch agent, TCP on
#                       the cluster's links only), so `mpirun -np H*R PROG` places R ranks on
#                       each host; exits with CMD's status
#   sh scripts/netns-cluster.sh kill I   kill -9 every process of host I (a failing host)
#   sh scripts/netns-cluster.sh status   the hosts, their link and their processes
#   sh scripts/netns-cluster.sh down     remove every namespace, link, qdisc and process of
#                                        the cluster; nothing to remove is not an error
#   common option (before the subcommand): --name NAME (default dpcc; letters and digits,
#                                          at most 8), so that clusters do not meet
#
# The layout: host I is namespaces NAME-hI (network) and RUN/hI.uts (hostname NAME-hI),
# address 10.77.0.(I+1)/24 on its eth0, a veth whose peer hI sits on bridge br0 inside a
# switch namespace NAME-sw. Each direction of each link is shaped by a tbf qdisc at RATE (the
# host's egress on eth0, its ingress on the switch's hI; a burst of 0.1 ms at RATE, at least
# two frames), so a host sends and receives at RATE in all, as a NIC does, whatever its ranks
# do. TCP through the kernel on shared cores may not fill RATE: bench-moe-dist.sh --cluster
# reports the rate reached. Every address lives inside namespaces
# made here; traffic goes only between them. RUN is /run/dpc-cluster/NAME: the hostfile
# (hosts), the launch agent (agent: `agent HOST CMD` runs CMD in HOST's namespaces, Open MPI's
# plm_rsh_agent) and the settings. The filesystem is the machine's, shared by every host.
#
# mpirun runs inside host 0 (run), starts its ranks there and an orted on every other host
# through the agent. tbf adds no delay (netem is missing from these kernels): a message
# costs the veth path's latency (tens of microseconds) plus its bytes at RATE.
#
# Needs root, ip (iproute2), tc, nsenter and unshare (util-linux); without them, or where
# namespaces cannot be made, one line on stderr and exit 1. Usage errors exit 2.
set -eu
me=netns-cluster.sh
name=dpcc
die() { echo "$me: $*" >&2; exit 1; }
usage() { echo "$me: $* (see --help)" >&2; exit 2; }
posint() {
	case $2 in '' | *[!0-9]* | 0*) usage "$1 wants a positive integer, not '$2'" ;; esac
	[ "$2" -le "$3" ] || usage "$1 is at most $3, not $2"
}

while [ $# -gt 0 ]; do
	case $1 in
	--name)
		[ $# -ge 2 ] || usage "--name needs a value"
		case $2 in '' | *[!a-z0-9]*) usage "--name wants lower-case letters and digits, not '$2'" ;; esac
		[ ${#2} -le 8 ] || usage "--name is at most 8 characters, not '$2'"
		name=$2; shift 2 ;;
	-h | --help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || usage "no subcommand (up, run, kill, status or down)"
cmd=$1; shift
state=/run/dpc-cluster/$name
sw=$name-sw

need_tools() {
	[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces), not uid $(id -u)"
	for t in ip tc nsenter unshare; do
		command -v $t >/dev/null 2>&1 ||
			die "needs '$t' (apt-get install iproute2 util-linux)"
	done
}

# The cluster's settings (H, R, link, mtu) from its state, or exit 1 when there is none.
load() {
	[ -f "$state/settings" ] || die "no cluster '$name' (run '$me up' first)"
	. "$state/settings"
}

# nsx NS CMD...: CMD in network namespace NS. Not `ip -n` or `tc -n`: those also remount /
# as a slave in a mount namespace of their own, which fails in a chroot (/ is no mount point)
nsx() {
	ns=$1; shift
	nsenter --net="/run/netns/$ns" -- "$@"
}

# host_exec I CMD...: CMD in host I's namespaces
host_exec() {
	i=$1; shift
	nsenter --net="/run/netns/$name-h$i" --uts="$state/h$i.uts" -- "$@"
}

# kill_ns NS: kill -9 every process in network namespace NS until none is left (bounded)
kill_ns() {
	n=0
	while [ $n -lt 50 ]; do
		pids=$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ')
		[ -n "$pids" ] || return 0
		# shellcheck disable=SC2086
		kill -9 $pids 2>/dev/null || true
		sleep 0.1
		n=$((n + 1))
	done
	die "processes of '$1' survive kill -9: $pids"
}

# Remove everything of cluster NAME that exists; quiet, and safe on a half-made cluster.
teardown() {
	for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
		case $ns in
		"$name"-h[0-9] | "$name"-h[0-9][0-9] | "$sw")
			kill_ns "$ns"
			ip netns delete "$ns" 2>/dev/null || true ;;
		esac
	done
	if [ -d "$state" ]; then
		for f in "$state"/h*.uts; do
			[ -e "$f" ] || continue
			umount "$f" 2>/dev/null || true
			rm -f "$f"
		done
		rm -f "$state/hosts" "$state/agent" "$state/settings" "$state/err"
		rmdir "$state" 2>/dev/null || true
	fi
	rmdir /run/dpc-cluster 2>/dev/null || true
	# ip netns add makes /run/netns a mount point of its own on first use; with no namespace
	# left in it, undo that too (ip makes it again when needed), so that nothing of ours stays
	# mounted (a chroot's /run could not be removed)
	if [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ] &&
		awk '$2 == "/run/netns" { f = 1 } END { exit !f }' /proc/mounts; then
		umount /run/netns 2>/dev/null || true
	fi
}

do_up() {
	H=2 R=2 link=1gbit mtu=9000
	while [ $# -gt 0 ]; do
		case $1 in
		-H | --hosts) [ $# -ge 2 ] || usage "$1 needs a value"; posint "$1" "$2" 64; H=$2; shift 2 ;;
		-R | --ranks) [ $# -ge 2 ] || usage "$1 needs a value"; posint "$1" "$2" 256; R=$2; shift 2 ;;
		--link)
			[ $# -ge 2 ] || usage "--link needs a value"
			echo "$2" | grep -Eq '^[0-9]+(\.[0-9]+)?(k|m|g)?bit$' ||
				usage "--link wants a rate such as 100mbit or 1gbit, not '$2'"
			link=$2; shift 2 ;;
		--mtu) [ $# -ge 2 ] || usage "--mtu needs a value"; posint "$1" "$2" 65535
			[ "$2" -ge 1280 ] || usage "--mtu is at least 1280, not $2"; mtu=$2; shift 2 ;;
		*) usage "up: unknown argument '$1'" ;;
		esac
	done
	need_tools
	teardown
	trap 'teardown; exit 1' INT TERM HUP
	# the burst: 0.1 ms at the rate, at least two frames, so that the link stays a wire (with
	# 1 ms, the first 125 KB of every message at 1 Gbit/s passed at memory speed and the
	# alpha-beta fit bent round them); queues of 100 ms
	bits=$(echo "$link" | awk '{ v = $0 + 0; u = substr($0, length($0) - 3, 1);
		m = u == "k" ? 1e3 : u == "m" ? 1e6 : u == "g" ? 1e9 : 1; print v * m }')
	burst=$(awk -v b="$bits" -v f="$mtu" 'BEGIN { x = b / 8 / 10000; if (x < 2 * f) x = 2 * f
		printf "%d", x }')
	mkdir -p "$state"
	ip netns add "$sw" 2>"$state/err" ||
		{ e=$(head -1 "$state/err"); teardown; die "cannot make network namespaces here (ip netns add: $e)"; }
	nsx "$sw" ip link set lo up
	nsx "$sw" ip link add br0 type bridge
	nsx "$sw" ip link set br0 mtu "$mtu" up
	: >"$state/hosts"
	i=0
	while [ $i -lt "$H" ]; do
		h=$name-h$i
		ip netns add "$h"
		ip link add eth0 mtu "$mtu" netns "$h" type veth peer name "h$i" mtu "$mtu" netns "$sw"
		nsx "$sw" ip link set "h$i" master br0 up
		nsx "$h" ip link set lo up
		nsx "$h" ip addr add "10.77.$((i / 250)).$((i % 250 + 1))/16" dev eth0
		nsx "$h" ip link set eth0 up
		nsx "$h" tc qdisc add dev eth0 root tbf rate "$link" burst "$burst" latency 100ms
		nsx "$sw" tc qdisc add dev "h$i" root tbf rate "$link" burst "$burst" latency 100ms
		: >"$state/h$i.uts"
		unshare --uts="$state/h$i.uts" hostname "$h"
		echo "$h slots=$R" >>"$state/hosts"
		i=$((i + 1))
	done
	rm -f "$state/err"
	cat >"$state/agent" <<EOF
#!/bin/sh
# Open MPI's launch agent for cluster '$name' (plm_rsh_agent): agent HOST CMD...
case \$1 in
$name-h[0-9] | $name-h[0-9][0-9]) h=\$1 ;;
*) echo "netns-cluster agent: no host '\$1' in cluster '$name'" >&2; exit 1 ;;
esac
[ -e "/run/netns/\$h" ] || { echo "netns-cluster agent: host '\$h' is down" >&2; exit 1; }
shift
exec nsenter --net="/run/netns/\$h" --uts="$state/\${h#$name-}.uts" -- /bin/sh -c "\$*"
EOF
	chmod 755 "$state/agent"
	printf 'H=%s R=%s link=%s mtu=%s burst=%s\n' "$H" "$R" "$link" "$mtu" "$burst" >"$state/settings"
	trap - INT TERM HUP
	opt=""
	[ "$name" = dpcc ] || opt=" --name $name"
	echo "$me: cluster '$name' up: $H hosts of $R ranks, links of $link each way (mtu $mtu); then: $me$opt run -- mpirun -np $((H * R)) PROG"
}

do_run() {
	host=0
	while [ $# -gt 0 ]; do
		case $1 in
		--host) [ $# -ge 2 ] || usage "--host needs a value"
			case $2 in '' | *[!0-9]*) usage "--host wants a host number, not '$2'" ;; esac
			host=$2; shift 2 ;;
		--) shift; break ;;
		*) break ;;
		esac
	done
	[ $# -ge 1 ] || usage "run: no command"
	need_tools
	load
	[ "$host" -lt "$H" ] || usage "--host $host: the cluster has hosts 0 to $((H - 1))"
	[ -e "/run/netns/$name-h$host" ] || die "host $host of cluster '$name' is down"
	# mpi_yield_when_idle: every host's slots are this machine's cores, shared
	host_exec "$host" env OMPI_MCA_plm_rsh_agent="$state/agent" \
		OMPI_MCA_orte_default_hostfile="$state/hosts" \
		OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 \
		OMPI_MCA_mpi_yield_when_idle=1 DPC_CLUSTER="$name" "$@"
}

do_kill() {
	[ $# -eq 1 ] || usage "kill wants one host number"
	case $1 in '' | *[!0-9]*) usage "kill wants a host number, not '$1'" ;; esac
	need_tools
	load
	[ "$1" -lt "$H" ] || usage "kill $1: the cluster has hosts 0 to $((H - 1))"
	kill_ns "$name-h$1"
}

do_status() {
	need_tools
	load
	echo "cluster '$name': $H hosts of $R ranks, links of $link each way (mtu $mtu, burst $burst bytes); hostfile $state/hosts"
	i=0
	while [ $i -lt "$H" ]; do
		h=$name-h$i
		if [ -e "/run/netns/$h" ]; then
			np=$(ip netns pids "$h" | wc -l)
			tx=$(nsx "$h" ip -s link show eth0 | awk '/TX:/ { getline; print $1 }')
			echo "  $h: up, $np processes, $tx bytes sent"
		else
			echo "  $h: down"
		fi
		i=$((i + 1))
	done
}

case $cmd in
up) do_up "$@" ;;
run) do_run "$@" ;;
kill) do_kill "$@" ;;
status) [ $# -eq 0 ] || usage "status takes no arguments"; do_status ;;
down) [ $# -eq 0 ] || usage "down takes no arguments"; need_tools; teardown
	echo "$me: cluster '$name' down" ;;
*) usage "unknown subcommand '$cmd' (up, run, kill, status or down)" ;;
esac
