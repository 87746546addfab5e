#!/bin/sh
# bench-dipaco.sh - what a DiPaCo run costs beyond training its paths, on this machine.
#
#   scripts/bench-dipaco.sh [-s] [TRAIN.tok]     (default data/brown/train.tok; val.tok beside it)
#
# 1. Phase overhead: DiPaCo 2x2 at gpt-tiny size (configs/dipaco-2x2.yaml, 4 paths), 2 phases
#    of TAU inner steps (default 30; BENCH_TAU), with 1 worker of 2 threads and with 2
#    workers of 1 thread (make -j). Pure training time is the sum of the paths' own step
#    times (train_seconds), evaluation on val.tok theirs too (eval_seconds); overhead is the
#    rest of the workers' time: process start, assembly from module files, checkpoint I/O,
#    outer steps, workers idle at the graph's joins.
# 2. dpc-outer's read throughput on the largest module of that run (two paths' copies), warm
#    page cache, against cat of the same files (whole files) to /dev/null: in MB/s, and in
#    time on the same files. (Dropping the page cache does not make reads cold in this
#    project's virtual machines: cat reads "cold" files at memory speed.)
# 3. dpc-outer's peak RSS on one module (the whole gpt-tiny model, 3.36M parameters: 26.8 MB
#    with momentum) averaged over 2 and over 16 paths, reading by piece and with --wait.
# 4. With -s, the paper's 16x16 DiPaCo by simulation: 256 tiny paths (L=2, C=64), 32 modules,
#    2 phases of 10 steps under make -j2; per-task overhead, and dpc-outer's time per module
#    against the number of paths averaged (DiLoCo runs of 4, 16, 64, 256 paths).
# Programs come from $BIN (default build/bin). About 4 minutes on 2 cores (with -s, 6).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "${BIN:-$here/../build/bin}" && pwd)
cfg=$here/../configs
scale=0
[ "${1:-}" = "-s" ] && { scale=1; shift; }
train=${1:-$here/../data/brown/train.tok}
val=$(dirname "$train")/val.tok
tau=${BENCH_TAU:-30}
[ -e "$train" ] && [ -e "$val" ] || { echo "$0: no $train (sh scripts/get-brown.sh data/brown, then dpc-shard prepare)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-dipaco.XXXXXX")
trap 'rm -rf "$work"' EXIT
py() { /usr/bin/python3 -c "$@"; }
now() { date +%s.%N; }

echo "bench-dipaco: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "== 1. phase overhead: dipaco-2x2 at gpt-tiny size, 4 paths, 2 phases of $tau steps"
printf '%-18s %7s %14s %11s %10s %9s %12s\n' "workers x threads" "wall s" "train s (sum)" "eval s" "overhead" "outer s" "outer share"
for wt in "1 2" "2 1"; do
	set -- $wt
	run=$work/speed-$1
	"$BIN/dpc-outer" init -c "$cfg/dipaco-2x2.yaml" -s dipaco.phases=2 -s dipaco.inner_steps="$tau" \
		-s train.steps=$((2 * tau)) -s train.warmup_steps=5 "$run" >/dev/null
	"$BIN/dpc-shard" split -q --random 4 "$train" "$run/shards" >/dev/null
	cp "$val" "$run/val.tok"
	t0=$(now)
	make -s -C "$run" -j "$1" THREADS="$2" >/dev/null
	t1=$(now)
	py "
import json
wall = $t1 - $t0; w = $1
ev = [json.loads(l) for l in open('$run/metrics.jsonl')]
tr = sum(e['train_seconds'] for e in ev if e['event'] == 'path')
evs = sum(e['eval_seconds'] for e in ev if e['event'] == 'path')
ou = sum(e['seconds'] for e in ev if e['event'] == 'outer')
print('%-18s %7.2f %14.2f %11.2f %9.1f%% %9.3f %11.2f%%' % ('%d x %d' % (w, $2), wall, tr, evs,
      100 * (1 - (tr + evs) / (w * wall)), ou, 100 * ou / (w * wall)))
"
done

echo
echo "== 2. dpc-outer read throughput against cat (module lower.0 of phase 2, 2 paths)"
# dpc-outer reads only the module's tensors of each file (bytes_read); cat reads the files
# whole (a path checkpoint also holds the other modules and the AdamW moments). Both rates,
# and the ratio of the times on the same files (best of 5 each, warm page cache).
run=$work/speed-2
files="$run/phase-0001/modules/lower.0.safetensors $run/phase-0002/paths/path-000.safetensors $run/phase-0002/paths/path-001.safetensors"
bytes=$(cat $files | wc -c)
outer_s() {
	rm -f "$run/phase-0002/modules/lower.0.safetensors"
	"$BIN/dpc-outer" step "$run" --phase 2 --module lower.0 -q "$@" >"$work/step.json"
	py "import json; d=json.load(open('$work/step.json')); print(d['read_seconds'], d['bytes_read'])"
}
cat_s() { t0=$(now); cat $files >/dev/null; t1=$(now); py "print($t1 - $t0)"; }
best() { b=""; for i in 1 2 3 4 5; do v=$("$@"); if [ -z "$b" ] || py "import sys; sys.exit(0 if float('${v%% *}') < float('${b%% *}') else 1)"; then b=$v; fi; done; echo "$b"; }
cat $files >/dev/null
c=$(best cat_s)
for t in 1 2; do
	o=$(best outer_s -t "$t")
	py "
c, (o, ob) = $c, '$o'.split()
o, ob = float(o), int(ob)
print('%d thread%s: dpc-outer %.1f ms, %.0f MB/s of the %.1f MB it reads; cat %.1f ms, %.0f MB/s of the %.1f MB of the files: %.2fx cat in MB/s, %.2fx in time' % ($t, 's' if $t > 1 else ' ', 1e3 * o, ob / 1e6 / o, ob / 1e6, 1e3 * c, $bytes / 1e6 / c, $bytes / 1e6, (ob / o) / ($bytes / c), c / o))
"
done
echo
echo "== 3. dpc-outer peak RSS on one module (gpt-tiny whole model, 3356160 parameters)"
printf '%-8s %14s %14s %16s\n' "paths" "by piece MB" "--wait MB" "module+momentum MB"
for P in 2 16; do
	run=$work/mem-$P
	"$BIN/dpc-outer" init -c "$cfg/diloco.yaml" -s dipaco.paths=$P -s dipaco.phases=1 \
		-s dipaco.inner_steps=1 -s train.steps=1 "$run" >/dev/null
	"$BIN/dpc-shard" split -q --random $P "$train" "$run/shards" >/dev/null
	make -s -C "$run" -j 2 phase-0001/paths/path-000.safetensors >/dev/null
	for p in $(seq 1 $((P - 1))); do
		printf 'phase-0001/paths/path-%03d.safetensors ' "$p"
	done | xargs make -s -C "$run" -j 2 >/dev/null
	rss() {
		rm -f "$run/phase-0001/modules/all.0.safetensors"
		/usr/bin/time -f %M "$BIN/dpc-outer" step "$run" --phase 1 -q "$@" 2>&1 >/dev/null | tail -1
	}
	a=$(rss -t 2); b=$(rss --wait=60)
	printf '%-8s %14.1f %14.1f %16.1f\n' "$P" "$(py "print($a/1024)")" "$(py "print($b/1024)")" 26.8
done

[ $scale = 1 ] || exit 0
echo
echo "== 4. 16x16 DiPaCo by simulation: 256 paths (L=2, C=64, T=64, B=4), 32 modules, 2 phases of 10 steps, make -j2"
cat >"$work/16x16.yaml" <<YAML
model: {n_layer: 2, n_embd: 64, n_head: 2, seq_len: 64, vocab_size: 256}
train: {batch_size: 4, steps: 20, warmup_steps: 2, eval_every: 0, eval_batches: 1, checkpoint_every: 0}
dipaco: {phases: 2, inner_steps: 10}
levels:
  - {name: lower, owns: embed h.0, modules: 16}
  - {name: upper, owns: h.1 head, modules: 16}
YAML
# Brown's 489 training documents cannot fill 256 shards: a synthetic corpus of 4000 short ones.
. "$here/../test/sh/corpus.sh"
make_corpus "$work/many.jsonl" 4000
"$BIN/dpc-shard" prepare --val-frac 0 --router-frac 0 "$work/many.jsonl" "$work/many" >/dev/null
train=$work/many/train.tok
run=$work/16x16
"$BIN/dpc-outer" init -c "$work/16x16.yaml" "$run" >/dev/null
"$BIN/dpc-shard" split -q --random 256 "$train" "$run/shards" >/dev/null
t0=$(now); make -s -C "$run" -j 2 >/dev/null; t1=$(now)
py "
import json
wall = $t1 - $t0
ev = [json.loads(l) for l in open('$run/metrics.jsonl')]
p = [e for e in ev if e['event'] == 'path']; o = [e for e in ev if e['event'] == 'outer']
task = sum(e['seconds'] for e in p); tr = sum(e['train_seconds'] for e in p); ou = sum(e['seconds'] for e in o)
n = len(p) + len(o)
print('wall %.1f s for %d tasks on 2 workers: training %.1f s, assembly from module files %.1f s (%.1f ms per path task), outer steps %.1f s (%.1f ms per module of 16 paths)' % (wall, n, tr, task - tr, 1000 * (task - tr) / len(p), ou, 1000 * ou / len(o)))
print('the rest, %.1f s of the 2 workers: process start, checkpoint writes, make: %.1f ms per task' % (2 * wall - task - ou, 1000 * (2 * wall - task - ou) / n))
"
sed -e '/^levels:/,$d' -e 's/inner_steps: 10/inner_steps: 1/' -e 's/steps: 20/steps: 1/' "$work/16x16.yaml" >"$work/flat.yaml"
printf 'levels:\n  - {name: all, owns: embed h.0-1 head, modules: 1}\n' >>"$work/flat.yaml"
printf '%-8s %12s %12s %14s\n' "paths" "outer s" "MB read" "ms per path"
for P in 4 16 64 256; do
	run=$work/sc-$P
	"$BIN/dpc-outer" init -c "$work/flat.yaml" -s dipaco.paths=$P -s dipaco.phases=1 "$run" >/dev/null
	"$BIN/dpc-shard" split -q --random $P "$train" "$run/shards" >/dev/null
	for p in $(seq 0 $((P - 1))); do
		printf 'phase-0001/paths/path-%03d.safetensors ' "$p"
	done | xargs make -s -C "$run" -j 2 >/dev/null
	best=""
	for i in 1 2 3; do
		rm -f "$run/phase-0001/modules/all.0.safetensors"
		"$BIN/dpc-outer" step "$run" --phase 1 -q -t 2 >"$run/step.json"
		best=$(py "import json; d=json.load(open('$run/step.json')); b='$best'; s=d['seconds']; print(s if not b or s < float(b) else b)")
	done
	py "import json; d=json.load(open('$run/step.json')); print('%-8d %12.4f %12.1f %14.2f' % ($P, $best, d['bytes_read']/1e6, 1000*$best/$P))"
done
