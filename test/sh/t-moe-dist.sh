# The distributed MoE layer under mpirun (test/mpi/test_moe_dist.c, moe-bench, moe-profile):
# at 2 and 4 ranks (and nodes of 2), every plan {r, d, a} gives the single-process layer's
# outputs and gradients and switching plans allocates nothing; ranks that disagree on the
# layer, and a dictionary measured for another world, fail with one line on every rank and
# exit 2, none hanging; moe-profile writes a dictionary moe-bench --dict reads, and refuses
# to overwrite it; moe-profile --simulate times every size in pairs and reports them. Every
# mpirun is under a time limit.
set -eu
. "$TESTDIR/lib.sh"
command -v mpirun >/dev/null 2>&1 || skip "skipped: no mpirun (apt-get install openmpi-bin)"
t=${MPITEST:-}/test_moe_dist
[ -n "${MPITEST:-}" ] && [ -x "$t" ] || skip "skipped: no MPI test programs (MPITEST; a build without MPI: apt-get install libopenmpi-dev)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Open MPI frees little at MPI_Finalize: LeakSanitizer would call it leaks (see t-dist.sh).
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
run() { mpi_run "$@"; } # lib.sh
# one_line_each N CODE PATTERN CMD...: exit CODE, and exactly N stderr lines, each matching
one_line_each() {
	n=$1 code=$2 pat=$3; shift 3
	run "$n" "$@" >out.stdout 2>out.stderr && rc=0 || rc=$?
	[ "$rc" = "$code" ] || { cat out.stderr; die "$* exited $rc, expected $code"; }
	[ "$(wc -l <out.stderr)" -eq "$n" ] || { cat out.stderr; die "$*: expected $n lines"; }
	[ "$(grep -Ec -- "$pat" out.stderr)" -eq "$n" ] ||
		{ cat out.stderr; die "$*: not every line matches '$pat'"; }
}

for args in "2" "4" "4 --local-size 2"; do
	set -- $args
	n=$1; shift
	run "$n" "$t" "$@" >all.out 2>&1 || { cat all.out; die "test_moe_dist at $args failed"; }
	[ "$(grep -c ' 0 failed$' all.out)" -eq "$n" ] ||
		{ cat all.out; die "test_moe_dist at $args: not every rank passed"; }
	grep -m1 'checks' all.out
done
one_line_each 2 2 "^test_moe_dist: rank [01]: ranks disagree on E: 2 on rank 0, 4 on rank 1$" \
	"$t" --disagree

shape="-T 256 -M 32 -H 64 -E 2 -t 1"
expect_ok run 2 "$BIN/moe-profile" $shape -R 128 --factors 1:2 -n 2 -w 1 -o d.txt --trials t.tsv
grep -q '^world 2$' d.txt || die "the dictionary does not record W=2"
[ "$(grep -c '^bucket ' d.txt)" -ge 2 ] || die "the dictionary has fewer than 2 buckets"
head -n 1 t.tsv | grep -q '^# bucket' || die "the trial table has no header"
one_line_each 2 2 "^moe-profile: 'd.txt' exists: refusing" "$BIN/moe-profile" $shape -o d.txt
printf '1.0\n2.0\n1.5\n' >trace.txt
expect_ok run 2 "$BIN/moe-bench" $shape --trace trace.txt --dict d.txt -n 3 -w 1
grep -q '"run":"dictionary-summary"' out.stdout || die "moe-bench --dict printed no summary"
sed 's/^world 2$/world 4/' d.txt >d4.txt
one_line_each 2 2 "^moe-bench: 'd4.txt': measured for W=4 ranks, this run has W=2$" \
	"$BIN/moe-bench" $shape --dict d4.txt
one_line_each 2 2 "^moe-bench: .*r=3 is not a parallelism degree" "$BIN/moe-bench" $shape --r 3
# --simulate on 4 ranks in given nodes of 2: every size from 1 KiB timed in 21 pairs, the
# count of pairs 2DH won within them, a barrier's time, and 2DH's phases within its total.
expect_ok run 4 "$BIN/moe-profile" --simulate --local-size 2 -t 1
/usr/bin/python3 - out.stdout <<'EOF' || die "moe-profile --simulate: the fit line is wrong"
import json, sys
fit = [j for j in map(json.loads, open(sys.argv[1])) if j.get("run") == "simulate-fit"]
assert len(fit) == 1, "one simulate-fit line"
f = fit[0]
assert f["W"] == 4 and f["local_size"] == 2 and f["levels"] == 2, f
assert f["sync_us"] > 0, f["sync_us"]
sizes = [p["kib_per_rank"] for p in f["points"]]
assert sizes == [1, 4, 16, 64, 256, 1024, 4096, 16384], sizes
for p in f["points"]:
    assert p["reps"] == 21 and 0 <= p["2dh_faster_reps"] <= 21, p
    assert p["linear_ms"] > 0 and p["2dh_ms"] > 0, p
    # the phases are medians of the same exchanges: their sum is within the total's spread
    assert sum(p["2dh_phases_ms"]) <= 3 * p["2dh_ms"], p
EOF
# Tutel's flags across ranks (issue 26), worked out by hand from Tutel's code and checked
# against Tutel 0.3 itself: at W = 2, --num_local_experts -2 is one expert shared by 2 ranks;
# T = 2 x 16 = 32 per rank, top-1, C = int(1.5 x 32) = 48, a multiple of (2 ranks per expert)
# x (overlap 2) = 4; --parallel_type model is r = 2, the overlap d = 2; 32 8 16 4 3 1 flops.
expect_ok run 2 "$BIN/moe-bench" --num_local_experts -2 --batch_size 2 --num_tokens 16 \
	--model_dim 8 --hidden_size 16 --top 1 --parallel_type model --a2a_ffn_overlap_degree 2 \
	--capacity_factor 1.5 --num_steps 1 -w 0 -t 1
/usr/bin/python3 - out.stdout <<'EOF' || die "Tutel's flags across ranks: $(cat out.stdout)"
import json, sys
o = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
t = o["tutel"]
assert (o["T"], o["E"], o["k"], o["W"]) == (32, 1, 1, 2), o
assert (t["experts"], t["ranks_per_expert"], t["capacity"], t["capacity_alignment"]) == (1, 2, 48, 4), t
assert o["capacity_per_step"] == [48], o["capacity_per_step"]
assert (o["plan"]["r"], o["plan"]["d"]) == (2, 2), o["plan"]
assert abs(t["gflop_per_step"] - 32 * 8 * 16 * 4 * 3 / 1e9) < 1e-15, t
EOF
one_line_each 2 2 "^moe-bench: option '--num_local_experts': -3: one expert shared by 3 ranks" \
	"$BIN/moe-bench" --num_local_experts -3 --dry-run
# Each rank's shard in Tutel's names (--save with {rank}, as Tutel's checkpoint_path), the
# files of all ranks put back together by the numpy reference of Tutel's layer, which
# recomputes every rank's output (test/ref/tutel_layer.py): experts split over ranks (one
# expert shared by 2, r = 2, pipelined) and whole experts per rank under a dictionary and a
# trace (the last step's setting). --load reads the shards back; a name without {rank} is
# refused before anything runs. --print-steps: rank 0 prints, as Tutel's dist_print.
REF=$(cd "$TESTDIR/../.." && pwd)/test/ref/tutel_layer.py
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
	expect_ok run 2 "$BIN/moe-bench" --num_local_experts -2 --batch_size 2 --num_tokens 16 \
		--model_dim 8 --hidden_size 16 --top 1 --parallel_type model \
		--a2a_ffn_overlap_degree 2 --capacity_factor 0.5 --num_steps 1 -w 0 -t 1 \
		--save 's-{rank}-of-{size}.st' --print-steps
	[ "$(grep -c '^STEP-0: loss = ' out.stderr)" = 1 ] ||
		die "--print-steps under mpirun: one line, rank 0's: $(cat out.stderr)"
	/usr/bin/python3 "$REF" check s-0-of-2.st s-1-of-2.st >ref.out ||
		{ cat ref.out; die "--save, one expert on 2 ranks: $(tail -n 1 ref.out)"; }
	expect_ok run 2 "$BIN/moe-bench" $shape --trace trace.txt --dict d.txt -n 3 -w 1 \
		--save 'l-{rank}.st'
	grep -q '"run":"dictionary-summary"' out.stdout || die "--dict --save printed no summary"
	/usr/bin/python3 "$REF" check l-0.st l-1.st >ref.out ||
		{ cat ref.out; die "--save under --dict: $(tail -n 1 ref.out)"; }
	grep -q 'capacity factor 1,' ref.out || die "--save records the last step's setting: $(cat ref.out)"
	expect_ok run 2 "$BIN/moe-bench" $shape -n 1 -w 0 --load 'l-{rank}.st' --save 'm-{rank}.st'
	for q in 0 1; do
		/usr/bin/python3 "$REF" same l-$q.st m-$q.st >/dev/null || die "--load rank $q's shard"
	done
fi
expect_ok run 2 "$BIN/moe-bench" $shape -E 4 -n 1 -w 0 --save 'w-{rank}.st'
one_line_each 2 1 "^moe-bench: 'w-[01].st': _num_global_experts is 4, this layer has 2 experts$" \
	"$BIN/moe-bench" $shape -n 1 -w 0 --load 'w-{rank}.st'
one_line_each 2 2 "^moe-bench: 'l.st': option '--save': each of the 2 ranks has its own shard of the layer: put \{rank\} in the name" \
	"$BIN/moe-bench" $shape -n 1 -w 0 --save l.st
[ ! -e l.st ] || die "--save without {rank} wrote l.st"
echo "test_moe_dist at 2 and 4 ranks; moe-profile and moe-bench --dict and --simulate; Tutel's flags; bad input refused"
