# t-moe-cluster-report.sh - scripts/moe-cluster-report.py (issue 24) on an output directory of
# `bench-moe-dist.sh --cluster 4x2` made here with hand-chosen figures: the sign test's
# verdict on the pairs 2DH won (two-sided, p < 0.05: 16 of 21 decides, 15 does not; 5 decides,
# 6 does not), the model's times at 4 hosts from the links fitted at 2 against values worked
# out by hand from the formulas of lib/dist/dist_model.h, the count of decisive sizes where
# the model agrees, the barrier's figures, and a missing input refused in one line (exit 1).
set -eu
. "$TESTDIR/lib.sh"
ROOT=$(cd "$TESTDIR/../.." && pwd)
PY=/usr/bin/python3
[ -x $PY ] || skip "skipped: no /usr/bin/python3"
REPORT=$ROOT/scripts/moe-cluster-report.py
cd "$SCRATCH"

# The links fitted at 2 hosts (W = 4, nodes of m = 2): within a host alpha 10 us at 1 GB/s
# (beta 1e-9 s/B), across hosts alpha 100 us at 0.1 GB/s (1e-8 s/B), stride copy 2 GB/s
# (c = 5e-10 s/B). At W = 8 (4 nodes), S bytes per rank:
#   Linear = max(1 (10e-6 + S/8 1e-9), 6 (100e-6 + S/8 1e-8))
#   2DH    = 2 S 5e-10 + 1 (10e-6 + S/2 1e-9) + 3 (100e-6 + S/4 1e-8)
# S = 1 KiB:  Linear 6 x 101.28 us = 0.608 ms; 2DH 1.024 + 10.512 + 3 x 102.56 = 0.319 ms.
# S = 4 KiB:  Linear 6 x 105.12 us = 0.631 ms; 2DH 4.096 + 12.048 + 3 x 110.24 = 0.347 ms.
# S = 64 KiB: Linear 6 x 181.92 us = 1.092 ms; 2DH 65.536 + 42.768 + 3 x 263.84 = 0.900 ms.
# S = 16 MiB: Linear 6 x 21.07152 ms = 126.429 ms;
#             2DH 16.777216 + 8.398608 + 3 x 42.04304 = 151.305 ms.
# At W = 4 (2 nodes), S = 16 MiB: Linear max(4.204 ms, 2 x 42.04304) = 84.086 ms;
#             2DH 16.777216 + 8.398608 + 1 x (0.1 + 83.88608) = 109.162 ms.
mkdir -p out
$PY - <<'EOF'
import json
links = {"intra": {"alpha_us": 10.0, "gbps": 1.0}, "inter": {"alpha_us": 100.0, "gbps": 0.1},
         "copy_gbps": 2.0}
def pt(kib, lin, h, won):
    return {"kib_per_rank": kib, "linear_ms": lin, "linear_model_ms": 0, "2dh_ms": h,
            "2dh_model_ms": 0, "2dh_phases_ms": [0, 0, 0], "2dh_faster_reps": won, "reps": 21}
def sim(W, sync, points):
    j = {"run": "simulate-fit", "W": W, "local_size": 2, "layout": "host", "levels": 2,
         "sync_us": sync, "points": points}
    j.update(links)
    return json.dumps(j) + "\n"
# At 2 hosts: 1 KiB a tie (10 of 21), 16 MiB Linear (3 of 21; the model: Linear).
open("out/sim-h2.json", "w").write(sim(4, 74.0, [pt(1, 0.1, 0.1, 10), pt(16384, 90, 110, 3)]))
# At 4 hosts: 1 KiB 2DH (16 of 21; model 2DH), 4 KiB Linear (5 of 21; model 2DH: the one
# disagreement), 64 KiB a tie (15 of 21), 16 MiB a tie (6 of 21).
open("out/sim-h4.json", "w").write(sim(8, 447.0, [pt(1, 0.7, 0.5, 16), pt(4, 0.6, 0.7, 5),
                                                 pt(64, 1.9, 1.7, 15), pt(16384, 400, 450, 6)]))
for h in (2, 4):
    sz = [{"bytes": b, "mpi_ms": 1.0, "linear_ms": 1.0, "2dh_ms": 1.0, "linear_over_mpi": 1.0,
           "2dh_over_mpi": 1.0} for b in (1024, 67108864)]
    open(f"out/a2a-h{h}.json", "w").write(json.dumps({"sizes": sz}) + "\n")
open("out/share.json", "w").write(json.dumps({"only": "layer", "step_ms": {"median": 600.0},
    "comm_ms": 300.0, "gemm_ms": 240.0, "T": 1024, "M": 512, "H": 256, "k": 2, "E": 8}) + "\n")
with open("out/dict-run.json", "w") as f:
    f.write(json.dumps({"only": "layer", "run": "r=0", "total_ms": 100.0}) + "\n")
    f.write(json.dumps({"only": "layer", "run": "dictionary-summary", "dict_total_ms": [95, 97],
        "dict_noise": 0.02, "dict_over_best": 0.96, "dict_over_median": 0.96,
        "dict_over_worst": 0.96, "static_plans": 1}) + "\n")
open("out/trace.txt", "w").write("1.0\n2.0\n")
open("out/trials.tsv", "w").write("# bucket\n1\t384\t0\t1\tlinear\t10.0\t9.0\t11.0\n")
open("out/settings", "w").write("cluster=4x2\nlink=1gbit\nquick=0\ncpu=test\ncores=2\n")
EOF

expect_ok $PY "$REPORT" out page.md
row() { grep -qF -- "$1" page.md || { grep '^| ' page.md | sed -n '1,40p'; die "page has no row '$1'"; }; }
row "| 1 | 0.700 | 0.608 | 0.500 | 0.319 | 16 of 21 | 2DH | 2DH |"
row "| 4 | 0.600 | 0.631 | 0.700 | 0.347 | 5 of 21 | Linear | 2DH |"
row "| 64 | 1.900 | 1.092 | 1.700 | 0.900 | 15 of 21 | = | 2DH |"
row "| 16384 | 400.000 | 126.429 | 450.000 | 151.305 | 6 of 21 | = | Linear |"
row "| 16384 | 90.000 | 84.086 | 110.000 | 109.162 | 3 of 21 | Linear | Linear |"
row "| 1 | 0.100 |"
grep -F "| 1 | 0.100 |" page.md | grep -qF "| 10 of 21 | = |" || die "10 of 21 is not a tie"
row "| 2 | 10.0 | 1.00 | 100.0 | 0.100 | 2.00 | 74 |"
row "| 4 | 10.0 | 1.00 | 100.0 | 0.100 | 2.00 | 447 |"
row "- 4 hosts of 2, measured: 2DH ahead of Linear at 1 KiB; behind at 4 KiB; a tie elsewhere."
row "- 2 hosts of 2, measured: 2DH ahead of Linear at no size; behind at 16 MiB; a tie elsewhere."
row "names the faster algorithm at 4 hosts at 1 of the 2 sizes where the measurement decides (4 sizes)."
row "names the faster algorithm on its own data at 1 of the 1 sizes where the measurement decides (2 sizes)."
row "the barrier alone costs 447 us at 4 hosts against 74 at 2"

rm out/sim-h4.json
expect_fail 1 "^moe-cluster-report.py: 'out/sim-h4.json': cannot read" $PY "$REPORT" out page2.md
[ ! -e page2.md ] && [ ! -e page2.md.part ] || die "a page was written from an incomplete directory"
echo "ok"
