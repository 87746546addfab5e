# scripts/netns-cluster.sh: a cluster of 2 hosts of 2 ranks on this machine, seen by Open MPI
# as 2 nodes (each rank's processor name is its host's; dist's host layout nodes of 2); the
# All-to-All algorithms deliver MPI_Alltoall's bytes across it (test_dist), through links that
# the shaper holds to their rate; a DiPaCo run under mpirun across the hosts, of which one is
# killed whole mid-phase, resumes to the final modules of a make -j2 run bit for bit; and after
# `down`, and after kill -9 of a half-made `up` followed by `down`, nothing of the cluster
# remains: namespaces, their bind-mounted hostnames, the state directory, processes. Skipped
# where network namespaces cannot be made (not root, no iproute2, a container without them).
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
root=$(cd "$TESTDIR/../.." && pwd)
nc="$root/scripts/netns-cluster.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
t=${MPITEST:-}/test_dist
[ -n "${MPITEST:-}" ] && [ -x "$t" ] || skip "skipped: no MPI test programs (MPITEST)"
[ "$(id -u)" -eq 0 ] || skip "skipped: network namespaces need root"
for c in ip tc nsenter unshare; do
	command -v $c >/dev/null 2>&1 || skip "skipped: no '$c' (apt-get install iproute2 util-linux)"
done
name=t$$
ip netns add "$name-probe" 2>/dev/null || skip "skipped: this machine cannot make network namespaces"
ip netns delete "$name-probe"
sh "$nc" --name "$name" down >/dev/null # also ip's mount of /run/netns, which the probe made
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
nc() { sh "$nc" --name "$name" "$@"; }
trap 'sh "$nc" --name "$name" down >/dev/null 2>&1 || true' EXIT

# ns_ids: the inodes of the cluster's namespaces (network and hostname), as /proc/PID/ns/*
# links name them
ns_ids() {
	for f in /run/netns/"$name"-* /run/dpc-cluster/"$name"/*.uts; do
		[ -e "$f" ] && stat -L -c %i "$f"
	done | tr '\n' ' '
}
# nothing_left WHEN [IDS]: no namespace, hostname mount or state of the cluster remains, and
# no process lives in one of the namespaces IDS
nothing_left() {
	! ip netns list | grep -q "^$name-" || die "$1: namespaces left: $(ip netns list | grep "^$name-")"
	! grep -q "/run/dpc-cluster/$name/" /proc/mounts || die "$1: a hostname mount is left"
	[ ! -e "/run/dpc-cluster/$name" ] || die "$1: /run/dpc-cluster/$name is left"
	# ip's own mount of /run/netns, where no other namespace needs it
	if [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
		! awk '$2 == "/run/netns" { f = 1 } END { exit !f }' /proc/mounts ||
			die "$1: /run/netns is left mounted with no namespace in it"
	fi
	for id in ${2:-}; do
		for p in /proc/[0-9]*/ns/net /proc/[0-9]*/ns/uts; do
			case $(readlink "$p" 2>/dev/null) in
			*"[$id]") die "$1: process $(echo "$p" | cut -d/ -f3) is left in a namespace of the cluster" ;;
			esac
		done
	done
}

# usage and state errors: one line each, nothing made
expect_fail 2 "^netns-cluster.sh: -H wants a positive integer, not '0' \(see --help\)$" nc up -H 0
expect_fail 2 "^netns-cluster.sh: --link wants a rate such as 100mbit or 1gbit, not '5'" nc up --link 5
expect_fail 2 "^netns-cluster.sh: unknown subcommand 'start'" nc start
expect_fail 1 "^netns-cluster.sh: no cluster '$name' \(run 'netns-cluster.sh up' first\)$" nc run -- true
if command -v setpriv >/dev/null 2>&1; then
	# a copy the other user can read (the checkout and the scratch directory may be private)
	ncopy=$(mktemp /tmp/netns-cluster.XXXXXX)
	cp "$nc" "$ncopy"
	chmod 644 "$ncopy"
	expect_fail 1 "^netns-cluster.sh: needs root \(network namespaces\), not uid 65534$" \
		setpriv --reuid=65534 --regid=65534 --clear-groups sh "$ncopy" --name "$name" up
	rm -f "$ncopy"
fi
nothing_left "after the refusals"

expect_ok nc up -H 2 -R 2 --link 200mbit
nsenter --net="/run/netns/$name-h0" tc qdisc show dev eth0 | grep -q "tbf .*rate 200Mbit" || die "no tbf on host 0's link"
nsenter --net="/run/netns/$name-sw" tc qdisc show dev h1 | grep -q "tbf .*rate 200Mbit" || die "no tbf towards host 1"
expect_fail 2 "^netns-cluster.sh: --host 2: the cluster has hosts 0 to 1" nc run --host 2 -- true

# 4 ranks, 2 per host by the hostfile, each on its own host's name
nc run -- timeout -k 5 60 mpirun --quiet -np 4 hostname >hosts.out 2>&1 || { cat hosts.out; die "mpirun hostname failed"; }
[ "$(sort hosts.out | uniq -c | awk '{ print $1 " " $2 }' | tr '\n' ' ')" = "2 $name-h0 2 $name-h1 " ] ||
	{ cat hosts.out; die "ranks are not 2 on each host"; }

# every exchange check of test_dist (its host layout: nodes of as many ranks as share a
# processor name, here 2) across the hosts
nc run -- timeout -k 10 240 mpirun --quiet -x ASAN_OPTIONS -np 4 "$t" >dist.out 2>&1 ||
	{ cat dist.out; die "test_dist across the cluster failed"; }
grep -q "^test_dist: 4 ranks: .* 0 failed over all ranks" dist.out || { cat dist.out; die "no summary"; }
cat dist.out

# the shaper holds the link: at 4 MiB per rank, each host sends 2 ranks x 2 MiB across, 4 MiB
# at 200 Mbit/s = 168 ms at the least (0.35 ms through shared memory); the bench's own check
# against MPI_Alltoall passes
nc run -- timeout -k 10 240 mpirun --quiet -x ASAN_OPTIONS -np 4 "$t" bench 0 2 4194304 >bench.out 2>&1 ||
	{ cat bench.out; die "test_dist bench across the cluster failed"; }
grep -q "nodes of 2 (host)" bench.out || { cat bench.out; die "bench: not nodes of 2 from the host"; }
awk '$1 == 4194304 { ok = $3 >= 0.134 && $5 >= 0.134 } END { exit !ok }' bench.out ||
	{ cat bench.out; die "4 MiB per rank crossed a 200 Mbit/s link in under 134 ms"; }
echo "shaped: $(awk '$1 == 4194304 { print "4 MiB per rank, linear " $3 " s, mpi " $5 " s" }' bench.out)"

# DiPaCo across the hosts: killed whole (host 1) mid-phase, then resumed, against make -j2
make_corpus c.jsonl 80
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
# train PREFIX RUNDIR ENGINE...: the whole run, its command after PREFIX (word-split)
train() {
	pre=$1 r=$2; shift 2
	$pre sh "$root/scripts/dipaco-train.sh" --bin "$BIN" -s model.n_embd=64 -s model.n_head=2 \
		-s model.seq_len=32 -s train.batch_size=2 -s train.warmup_steps=2 \
		-s train.eval_batches=1 -s dipaco.phases=3 -s dipaco.inner_steps=30 \
		-s train.steps=90 "$@" "$root/configs/dipaco-2x2.yaml" "$r" d/train.tok d/val.tok
}
train "" viamake -j 2 >make.out 2>&1 || { cat make.out; die "the make run failed"; }
train "nc run --" viaclu --mpi 4 >clu1.out 2>&1 &
pid=$!
i=0
while [ $i -lt 3000 ] && ! ls viaclu/phase-0002/paths/*.jsonl.part >/dev/null 2>&1; do
	sleep 0.01; i=$((i + 1))
done
[ $i -lt 3000 ] || { cat clu1.out; die "phase 2 never started on the cluster"; }
expect_ok nc kill 1
wait "$pid" && { cat clu1.out; die "the launch succeeded although host 1 was killed"; }
train "nc run --" viaclu --mpi 4 >clu2.out 2>&1 || { cat clu2.out; die "the rerun on the cluster failed"; }
for m in lower.0 lower.1 upper.0 upper.1; do
	same_file "viamake/phase-0003/modules/$m.safetensors" "viaclu/phase-0003/modules/$m.safetensors"
done
echo "make -j2 and mpirun -np 4 over 2 hosts (host 1 killed in phase 2, rerun): the same final modules"

ids=$(ns_ids)
[ -n "$ids" ] || die "no namespaces to look for"
expect_ok nc down
nothing_left "after down" "$ids"

# kill_up HOST: an up of 6 hosts, killed with SIGKILL once host HOST exists
kill_up() {
	sh "$nc" --name "$name" up -H 6 -R 1 >/dev/null 2>&1 &
	pid=$!
	i=0
	while [ $i -lt 500 ] && ! ip netns list | grep -q "^$name-h$1"; do sleep 0.01; i=$((i + 1)); done
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
# kill -9 of a half-made up, then an up over its leftovers; again, then down
kill_up 1
ip netns list | grep -q "^$name-" || die "the killed up had made nothing to clean (too fast?)"
expect_ok nc up -H 2 -R 1
[ "$(ip netns list | grep -c "^$name-")" -eq 3 ] || die "up over a killed up: not 2 hosts and a switch"
kill_up 3
expect_ok nc down
nothing_left "after kill -9 of up and down"
echo "down leaves nothing, also after kill -9 of a half-made up"
