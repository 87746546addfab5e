# t-moe-trace.sh - scripts/moe-trace.py: an MoE run's metrics into the capacity trace moe-bench
# replays.
#  (a) a fixture of "moe" events with hand-computed settings: N = 100 tokens, E = 8, k = 2, so
#      ceil(N/E) = 13 and C(x) = 2 int(13 x); a step whose largest expert count is 30 needs
#      int(13 x) >= 15, x = 15/13 (the smallest); 27 needs 14/13; 26 needs 1; the default
#      takes each step's largest over its blocks, --block one block's;
#  (b) moe-bench replays the trace of a real run (a tiny MoE GPT trained here) and its
#      capacities per step are each step's largest expert count rounded up to a multiple of k,
#      as the run's metrics say;
#  (c) refusals: a dense run's metrics, a block the run does not have, a line that is not JSON.
set -eu
. "$TESTDIR/lib.sh"

PY=/usr/bin/python3
ROOT=$(cd "$TESTDIR/../.." && pwd)
TRACE="$ROOT/scripts/moe-trace.py"
[ -x "$PY" ] || skip "skipped: no $PY"

ev() { # ev STEP BLOCK NEED
	printf '{"event":"moe","step":%d,"block":%d,"tokens":100,"experts":8,"top_k":2,"capacity":26,"need":%d,"need_factor":%s,"dropped":0,"aux_loss":1}\n' \
		"$1" "$2" "$3" "$(awk "BEGIN { print $3 * 8 / 200 }")"
}
{
	echo '{"event":"train","step":1,"loss":5}'
	ev 1 1 30; ev 1 3 20
	ev 2 1 26; ev 2 3 27
	ev 3 1 26; ev 3 3 25
} >fix.jsonl
"$PY" "$TRACE" fix.jsonl -o all.txt || die "moe-trace.py fix.jsonl failed"
"$PY" "$TRACE" fix.jsonl --block 3 -o b3.txt || die "moe-trace.py --block 3 failed"
"$PY" - all.txt b3.txt <<'EOF' || die "(a) the settings are not the hand-computed ones"
import sys
def vals(p):
    return [float(l) for l in open(p) if l.strip() and not l.startswith("#")]
want_all = [15 / 13, 14 / 13, 1.0]   # needs 30, 27, 26
want_b3 = [10 / 13, 14 / 13, 13 / 13]  # needs 20, 27, 25 (int(13 x) >= 10, 14, 13)
ok = True
for name, got, want in (("all", vals(sys.argv[1]), want_all), ("block 3", vals(sys.argv[2]), want_b3)):
    for g, w in zip(got, want):
        # the smallest such x, up to the ulps that make the product reach it
        ok &= len(got) == len(want) and w <= g <= w * (1 + 1e-15) and 2 * int(g * 13) >= 2 * round(w * 13)
    print(f"(a) {name}: {got} (want {want})")
sys.exit(0 if ok else 1)
EOF
grep -q '^# replay: moe-bench -T 100 -E 8 -k 2 ' all.txt || die "(a) no replay line: $(cat all.txt)"

# (b) a real run's trace replayed
for p in dpc-train-path moe-bench; do
	[ -x "$BIN/$p" ] || skip "skipped: $BIN/$p not built yet"
done
"$PY" - >docs.jsonl <<'EOF'
import json, random
rng = random.Random(5)
w = "the of and to in a is that for it as was with be by on not he this are".split()
for d in range(30):
    print(json.dumps({"id": f"d{d}", "text": " ".join(rng.choice(w) for _ in range(400))}))
EOF
expect_ok "$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 docs.jsonl data
expect_ok "$BIN/dpc-train-path" -c "$ROOT/configs/gpt-small-test.yaml" -s moe.experts=4 \
	-s moe.top_k=2 -s moe.every=1 -s moe.capacity_factor=1.0 -s train.steps=12 \
	-s train.eval_every=0 -d data/train.tok -o m.st -m m.jsonl -t 1 -q
"$PY" "$TRACE" m.jsonl -o run.txt --plot run.png || die "moe-trace.py m.jsonl failed"
[ -s run.png ] || die "(b) no plot"
expect_ok "$BIN/moe-bench" -T 128 -E 4 -k 2 -M 32 -H 128 --trace run.txt -n 12 -w 0
"$PY" - out.stdout m.jsonl <<'EOF' || die "(b) the replay's capacities are not the run's needs"
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
got = j["capacity_per_step"]
ev = [json.loads(l) for l in open(sys.argv[2]) if '"event":"moe"' in l]
need = {}
for e in ev:
    need[e["step"]] = max(need.get(e["step"], 0), e["need"])
want = [-(-need[s] // 2) * 2 for s in sorted(need)]
print(f"(b) replayed capacities {got}\n    the run's needs, to a multiple of k {want}")
sys.exit(0 if got == want else 1)
EOF

# (c) refusals, one line each
echo '{"event":"train","step":1,"loss":5}' >dense.jsonl
expect_fail 1 "moe-trace.py: 'dense.jsonl': no \"moe\" event" "$PY" "$TRACE" dense.jsonl
expect_fail 1 "moe-trace.py: 'fix.jsonl': block 2 is not an MoE block of the run \(those are 1, 3\)" \
	"$PY" "$TRACE" fix.jsonl --block 2
{ cat fix.jsonl; echo '{"event":'; } >bad.jsonl
expect_fail 1 "moe-trace.py: 'bad.jsonl': line 8 is not JSON" "$PY" "$TRACE" bad.jsonl
expect_fail 1 "moe-trace.py: 'nope.jsonl': No such file" "$PY" "$TRACE" nope.jsonl
echo "t-moe-trace: ok"
