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
#
# --quick: small sizes, a few minutes. The full run takes ~10 minutes on a quiet 2-core
# machine. Programs come from $BIN (default build/bin).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$here/../build/bin}
quick=0
out=""
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 ;;
	--out) out=$2; shift ;;
	-h|--help) sed -n '/^#   sh /p' "$0" | sed 's/^#   sh/usage: sh/'; exit 0 ;;
	*) echo "bench-moe-dist.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
	shift
done
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
