#!/bin/sh
# bench-moe-dist.sh - the distributed MoE layer's figures, measured in one invocation:
#
#  1. exchanges: moe-bench --only=alltoall at 2 and 8 ranks, our Linear and 2DH against
#     MPI_Alltoall on the same buffers, 1 KiB to 64 MiB per rank (8 ranks oversubscribe a
#     small machine: their times measure the scheduler as much as the copies);
#  2. the layer at W=2 against one process with the same total tokens (2 ranks of 1 thread
#     against 1 process of 2 threads, and of 1 thread), forward + backward, plan r=1 d=1;
#  3. pipelining: d = 1, 2, 4, 8 at W=2, with the share of the exchanges the experts hid;
#  4. the dictionary: moe-profile over capacity factors 1..4.4, then moe-bench --dict on a
#     trace whose factor wanders between 1 and 4.4 (Tutel's fig. 1 shape), next to every
#     static plan on the same trace;
#  5. the same where the exchanges are a real share of a step (T=64 per rank, M=1024,
#     H=32: little compute per byte moved), 400 steps per run: on one host the exchanges
#     are memory copies, so only such a layer lets the plans differ by more than the noise.
# It prints the tables of each step and a summary; raw JSON Lines stay in --out DIR, and a
# stage whose output is already there is not run again (a new DIR measures everything).
#
#   sh scripts/bench-moe-dist.sh [--quick] [--out DIR]
#   sh scripts/bench-moe-dist.sh --cluster HxR [--link RATE] [--quick] [--out DIR] [-o PAGE]
#
# --quick: small sizes, a few minutes. The full run takes ~10 minutes on a quiet 2-core
# machine. Programs come from $BIN (default build/bin).
#
# --cluster HxR (as root): the same questions where links cost, on an emulated cluster of H
# hosts of R ranks (scripts/netns-cluster.sh; default link 1gbit each way, --link RATE in tc's
# words), made here and removed at exit:
#  C1. at 2 hosts and at H: our Linear and 2DH against MPI_Alltoall, 1 KiB to 64 MiB per rank;
#      moe-profile --simulate (the alpha-beta model, each level fitted to its 2DH phase);
#  C2. the model fitted at 2 hosts predicts Linear and 2DH at H hosts: checked against the
#      times measured there, size by size (the direction: which of the two is faster);
#  C3. at H hosts, the layer (T=1024 per rank, M=512, H=256, E=H*R, k=2; --quick: T=256,
#      M=256, H=256): the share of its step spent in exchanges at plan r=1 d=1; moe-profile's
#      dictionary over capacity factors 1..4.4, then every static plan {r, d, a} and the
#      dictionary on a trace whose factor wanders between 1 and 4.4 (Tutel's fig. 1 shape);
#  then the results page PAGE (default results/moe-cluster.md; --quick: DIR/moe-cluster.md),
#  written by scripts/moe-cluster-report.py from DIR.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$here/../build/bin}
quick=0
out=""
cluster="" link=1gbit page=""
need() { [ "$2" -ge 2 ] || { echo "bench-moe-dist.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 ;;
	--out) need "$1" $#; out=$2; shift ;;
	--cluster) need "$1" $#; cluster=$2; shift
		echo "$cluster" | grep -Eq '^[1-9][0-9]*x[1-9][0-9]*$' ||
			{ echo "bench-moe-dist.sh: --cluster wants HxR (hosts x ranks per host), not '$cluster'" >&2; exit 2; } ;;
	--link) need "$1" $#; link=$2; shift ;;
	-o) need "$1" $#; page=$2; shift ;;
	-h|--help) sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d'; exit 0 ;;
	*) echo "bench-moe-dist.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done
if [ -z "$cluster" ] && { [ "$link" != 1gbit ] || [ -n "$page" ]; }; then
	echo "bench-moe-dist.sh: --link and -o are for --cluster" >&2; exit 2
fi
command -v mpirun >/dev/null 2>&1 || { echo "bench-moe-dist.sh: no mpirun (apt-get install openmpi-bin)" >&2; exit 1; }
[ -x "$BIN/moe-bench" ] && [ -x "$BIN/moe-profile" ] || { echo "bench-moe-dist.sh: no programs in $BIN (run make)" >&2; exit 1; }
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/bench-moe-dist.XXXXXX")
mkdir -p "$out"
# Root is allowed to launch (containers); OMP_WAIT_POLICY=active: see moe-bench(1).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=active
mpi() {
	n=$1; shift
	mpirun --quiet --oversubscribe --bind-to none -x OMP_WAIT_POLICY -np "$n" "$@"
}

if [ -n "$cluster" ]; then
	nh=${cluster%x*} R=${cluster#*x}
	[ "$nh" -ge 2 ] && [ "$R" -ge 2 ] ||
		{ echo "bench-moe-dist.sh: --cluster wants 2 hosts or more of 2 ranks or more (2DH has two levels), not $cluster" >&2; exit 2; }
	name=bmd$$
	nc() { sh "$here/netns-cluster.sh" --name "$name" "$@"; }
	trap 'nc down >/dev/null 2>&1 || true' EXIT
	trap 'exit 1' INT TERM HUP
	# mpc N ARGS...: ARGS on N ranks of the cluster (R per host, by its hostfile)
	mpc() { n=$1; shift; nc run -- mpirun --quiet --bind-to none -x OMP_WAIT_POLICY -np "$n" "$@"; }
	echo "bench-moe-dist.sh: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); cluster $cluster, links of $link; raw output in $out"
	printf 'cluster=%s\nlink=%s\nquick=%s\ncpu=%s\ncores=%s\n' "$cluster" "$link" "$quick" \
		"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$(nproc)" >"$out/settings"
	if [ $quick = 1 ]; then
		T=256 M=256 H=256 iters=3 piters=3 f_win=64 steps=20
	else
		T=1024 M=512 H=256 iters=5 piters=5 f_win=256 steps=40
	fi
	hosts=2
	[ "$nh" -eq 2 ] || hosts="2 $nh"
	for h in $hosts; do
		W=$((h * R))
		echo "== C1. $h hosts of $R ranks: All-to-All and the alpha-beta fit"
		[ -s "$out/a2a-h$h.json" ] && [ -s "$out/sim-h$h.json" ] && continue
		nc up -H "$h" -R "$R" --link "$link" >/dev/null
		[ -s "$out/a2a-h$h.json" ] ||
			mpc "$W" "$BIN/moe-bench" --only=alltoall -E "$W" -M 1024 -t 1 -n 5 -w 1 \
				>"$out/a2a-h$h.json.part" 2>"$out/a2a-h$h.txt"
		[ -s "$out/a2a-h$h.json" ] || mv "$out/a2a-h$h.json.part" "$out/a2a-h$h.json"
		mpc "$W" "$BIN/moe-profile" --simulate -t 1 >"$out/sim-h$h.json.part" 2>"$out/sim-h$h.txt"
		mv "$out/sim-h$h.json.part" "$out/sim-h$h.json"
		sed -n '1,9p' "$out/sim-h$h.txt"
	done
	W=$((nh * R))
	shape="-T $T -M $M -H $H -E $W -k 2 -t 1"
	echo "== C3. the layer on $nh hosts of $R ranks ($shape)"
	if ! [ -s "$out/share.json" ] || ! [ -s "$out/dict.txt" ] || ! [ -s "$out/dict-run.json" ]; then
		nc up -H "$nh" -R "$R" --link "$link" >/dev/null
		# shellcheck disable=SC2086
		[ -s "$out/share.json" ] || { mpc "$W" "$BIN/moe-bench" $shape -c 1.0 --r 1 --d 1 \
			-n "$iters" -w 1 >"$out/share.json.part" 2>"$out/share.txt" &&
			mv "$out/share.json.part" "$out/share.json"; }
		# shellcheck disable=SC2086
		[ -s "$out/dict.txt" ] || mpc "$W" "$BIN/moe-profile" $shape --factors 1:4.4 -R "$f_win" \
			-n "$piters" -w 1 -f -o "$out/dict.txt" --trials "$out/trials.tsv" \
			>"$out/profile.json" 2>"$out/profile.txt"
		awk -v n="$steps" 'BEGIN { for (i = 0; i < n; i++) { s = sin(i * 0.37) * cos(i * 0.11);
			printf "%.3f\n", 1 + 3.4 * (s < 0 ? -s : s) } }' >"$out/trace.txt"
		# shellcheck disable=SC2086
		[ -s "$out/dict-run.json" ] || { mpc "$W" "$BIN/moe-bench" $shape --trace "$out/trace.txt" \
			--dict "$out/dict.txt" -n "$steps" -w 2 >"$out/dict-run.json.part" 2>"$out/dict-run.txt" &&
			mv "$out/dict-run.json.part" "$out/dict-run.json"; }
		tail -n 1 "$out/dict-run.txt"
	fi
	nc down >/dev/null
	[ -n "$page" ] || { if [ $quick = 1 ]; then page=$out/moe-cluster.md; else page=$here/../results/moe-cluster.md; fi; }
	/usr/bin/python3 "$here/moe-cluster-report.py" "$out" "$page"
	exit 0
fi

if [ $quick = 1 ]; then
	T=1024 M=256 H=512 iters=3 f_win=256 piters=3
else
	T=2048 M=512 H=1024 iters=5 f_win=1024 piters=7
fi
echo "bench-moe-dist.sh: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); raw output in $out"

echo "== 1. All-to-All: ours against MPI_Alltoall (M=1024 floats per row)"
for n in 2 8; do
	[ -s "$out/a2a-$n.json" ] ||
		mpi "$n" "$BIN/moe-bench" --only=alltoall -E "$n" -M 1024 -t 1 -n 10 -w 2 \
			>"$out/a2a-$n.json"
done

echo "== 2. The layer: W=2 ranks of T=$T tokens against one process of $((2 * T))"
shape="-M $M -H $H -E 2 -k 2 -c 1.0 -n $iters -w 1"
[ -s "$out/one-2t.json" ] || "$BIN/moe-bench" $shape -T $((2 * T)) -t 2 >"$out/one-2t.json"
[ -s "$out/one-1t.json" ] || "$BIN/moe-bench" $shape -T $((2 * T)) -t 1 >"$out/one-1t.json"
[ -s "$out/dist-r1.json" ] ||
	mpi 2 "$BIN/moe-bench" $shape -T "$T" -t 1 --r 1 --d 1 >"$out/dist-r1.json"
[ -s "$out/dist-r0.json" ] || mpi 2 "$BIN/moe-bench" $shape -T "$T" -t 1 --r 0 >"$out/dist-r0.json"

echo "== 3. Pipelining at W=2"
for d in 1 2 4 8; do
	[ -s "$out/pipe-$d.json" ] ||
		mpi 2 "$BIN/moe-bench" $shape -T "$T" -t 1 --r 1 --d "$d" >"$out/pipe-$d.json"
done

echo "== 4. The dictionary"
dict="$out/dict.txt"
[ -s "$dict" ] || mpi 2 "$BIN/moe-profile" -T "$T" -M "$M" -H "$H" -E 2 -k 2 -t 1 \
	--factors 1:4.4 -R "$f_win" -n "$piters" -w 2 -o "$dict" --trials "$out/trials.tsv" \
	>"$out/profile.json"
# A factor wandering between 1 and 4.4, 40 steps.
awk 'BEGIN { for (i = 0; i < 40; i++) { s = sin(i * 0.37) * cos(i * 0.11);
	printf "%.3f\n", 1 + 3.4 * (s < 0 ? -s : s) } }' >"$out/trace.txt"
[ -s "$out/dict-run.json" ] ||
	mpi 2 "$BIN/moe-bench" -T "$T" -M "$M" -H "$H" -E 2 -k 2 -t 1 --trace "$out/trace.txt" \
		--dict "$dict" -n 40 -w 2 >"$out/dict-run.json"

echo "== 5. The dictionary where exchanges matter (T=64, M=1024, H=32)"
small="-T 64 -M 1024 -H 32 -E 2 -k 2 -t 1"
[ -s "$out/dict-small.txt" ] || mpi 2 "$BIN/moe-profile" $small --factors 1:4.4 -R 32 -n 21 \
	-w 5 -o "$out/dict-small.txt" --trials "$out/trials-small.tsv" >"$out/profile-small.json"
[ -s "$out/dict-small-run.json" ] ||
	mpi 2 "$BIN/moe-bench" $small --trace "$out/trace.txt" --dict "$out/dict-small.txt" \
		-n 400 -w 20 >"$out/dict-small-run.json"

echo "== summary"
/usr/bin/python3 - "$out" <<'EOF'
import json, sys, statistics
out = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{out}/{name}") if l.strip()]
for n in (2, 8):
    rows = lines(f"a2a-{n}.json")[0]["sizes"]
    worst = max(r["linear_over_mpi"] for r in rows)
    print(f"exchange W={n}: linear/MPI_Alltoall from {min(r['linear_over_mpi'] for r in rows):.2f}"
          f" to {worst:.2f} over {rows[0]['bytes']}..{rows[-1]['bytes']} bytes per rank;"
          f" 2dh/MPI {min(r['2dh_over_mpi'] for r in rows):.2f}..{max(r['2dh_over_mpi'] for r in rows):.2f}")
one2 = lines("one-2t.json")[0]["step_ms"]["median"]
one1 = lines("one-1t.json")[0]["step_ms"]["median"]
r1 = lines("dist-r1.json")[0]["step_ms"]["median"]
r0 = lines("dist-r0.json")[0]["step_ms"]["median"]
print(f"layer: W=2 r=1 {r1:.2f} ms, r=0 {r0:.2f} ms; one process 2 threads {one2:.2f} ms"
      f" (W=2 r=1 / one process {r1 / one2:.2f}), 1 thread {one1:.2f} ms")
for d in (1, 2, 4, 8):
    j = lines(f"pipe-{d}.json")[0]
    ov = j.get("overlap")
    print(f"pipelining d={d}: step {j['step_ms']['median']:.2f} ms, exchanges {j['comm_ms']:.2f} ms,"
          f" hidden {'-' if ov is None or d == 1 else f'{100 * ov:.0f}%'}")
for name in ("dict-run.json", "dict-small-run.json"):
    s = [j for j in lines(name) if j.get("run") == "dictionary-summary"][0]
    print(f"dictionary ({'T=64 M=1024 H=32' if 'small' in name else 'the layer above'}):"
          f" {s['dict_total_ms'][0]:.1f} / {s['dict_total_ms'][1]:.1f} ms (noise {100 * s['dict_noise']:.1f}%);"
          f" over best static {s['dict_over_best']:.3f}, over median {s['dict_over_median']:.3f},"
          f" over worst {s['dict_over_worst']:.3f} ({s['static_plans']} static plans)")
EOF
