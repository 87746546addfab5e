# DiPaCo runs: DiLoCo with one path degenerates to dense training bit for bit; a 2x2 run under
# make -j2 survives workers and outer steps killed with SIGKILL at many points, and its final
# modules are bit-identical to an uninterrupted run's.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
cfgdir=$TESTDIR/../../configs
make_corpus c.jsonl 80
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
small="-s model.n_embd=32 -s model.n_head=2 -s model.seq_len=32 -s train.batch_size=2
       -s train.warmup_steps=2 -s train.eval_batches=1"

# ---- DiLoCo with one path, outer lr 1, momentum 0: T phases of tau steps == T*tau dense ----
# shellcheck disable=SC2086
expect_ok "$BIN/dpc-outer" init -c "$cfgdir/dense.yaml" $small -s dipaco.phases=3 \
	-s dipaco.inner_steps=4 -s train.steps=12 dl
expect_ok "$BIN/dpc-shard" split -q --random 1 d/train.tok dl/shards
make -s -C dl -j2 >/dev/null 2>make.err || { cat make.err; die "make of the DiLoCo run failed"; }
# shellcheck disable=SC2086
expect_ok "$BIN/dpc-train-path" -q -c "$cfgdir/dense.yaml" $small -s dipaco.phases=3 \
	-s dipaco.inner_steps=4 -s train.steps=12 -d dl/shards/shard-000.tok -o dense.safetensors
python3 "$TESTDIR/stcmp.py" dl/phase-0003/modules/all.0.safetensors dense.safetensors \
	|| die "3 phases of 4 steps differ from 12 dense steps"
# and the path checkpoint of the last phase is that dense checkpoint, moments and step too
python3 "$TESTDIR/stcmp.py" dense.safetensors dl/phase-0003/paths/path-000.safetensors \
	|| die "the last path checkpoint differs from the dense one"
echo "DiLoCo, 1 path, 3 x 4 steps == 12 dense steps, bit for bit"

# ---- 2x2 DiPaCo: the reference run, uninterrupted ----------------------------------------
run_init() {
	# shellcheck disable=SC2086
	expect_ok "$BIN/dpc-outer" init -c "$cfgdir/dipaco-2x2.yaml" $small -s dipaco.phases=3 \
		-s model.n_embd=64 -s dipaco.inner_steps=40 -s train.steps=120 "$1"
	expect_ok "$BIN/dpc-shard" split -q --random 4 --seed 3 d/train.tok "$1/shards"
	cp d/val.tok "$1/val.tok"
}
finals() { ls "$1"/phase-0003/modules/*.safetensors | wc -l; }
run_init ref
make -s -C ref -j2 >/dev/null 2>make.err || { cat make.err; die "make of the reference failed"; }
[ "$(finals ref)" = 4 ] || die "the reference run has $(finals ref) final modules, expected 4"

# the outer step's bits depend neither on its thread count nor on folding by piece (every path
# present) or by path (--wait)
cp -r ref again
for how in "-t 1" "-t 3" "--wait=30 -t 1"; do
	rm -f again/phase-0003/modules/lower.0.safetensors
	# shellcheck disable=SC2086
	expect_ok "$BIN/dpc-outer" step again --phase 3 --module lower.0 -q $how
	same_file ref/phase-0003/modules/lower.0.safetensors again/phase-0003/modules/lower.0.safetensors
done
echo "outer step with 1 and 3 threads, by piece and by path: the same bits"

# tensors of several 64 KiB pieces (n_embd 128: mlp.c_fc is 4 pieces): the same bits with 1
# and 3 threads, path by path, and path by path because few files may be open; a byte
# flipped in the third piece of a path's tensor is caught whichever way it is read
# shellcheck disable=SC2086
expect_ok "$BIN/dpc-outer" init -c "$cfgdir/dipaco-2x2.yaml" $small -s model.n_embd=128 \
	-s dipaco.phases=1 -s dipaco.inner_steps=1 -s train.steps=1 wide
expect_ok "$BIN/dpc-shard" split -q --random 4 d/train.tok wide/shards
for p in 0 1; do expect_ok "$BIN/dpc-train-path" -q --run wide --phase 1 --path $p; done
w=wide/phase-0001/modules/lower.0.safetensors
expect_ok "$BIN/dpc-outer" step wide --phase 1 --module lower.0 -q -t 1
cp $w wide.ref
for how in "-t 3" "--wait=30" "few-files"; do
	rm -f $w
	if [ "$how" = few-files ]; then
		(ulimit -n 14; exec "$BIN/dpc-outer" step wide --phase 1 --module lower.0 -q) \
			>out.stdout 2>out.stderr || { cat out.stderr; die "step with 14 files failed"; }
	else
		# shellcheck disable=SC2086
		expect_ok "$BIN/dpc-outer" step wide --phase 1 --module lower.0 -q $how
	fi
	same_file wide.ref $w
done
p1=wide/phase-0001/paths/path-001.safetensors
cp $p1 p1.good
off=$(python3 -c "
import json, struct
raw = open('$p1', 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
print(8 + n + json.loads(raw[8:8 + n])['h.0.mlp.c_fc.weight']['data_offsets'][0] + 2 * 65536 + 100)")
printf '\377' | dd of=$p1 bs=1 seek="$off" conv=notrunc 2>/dev/null
for how in "-t 1" "-t 3" "--wait=30"; do
	rm -f $w
	# shellcheck disable=SC2086
	expect_fail 1 "path-001\.safetensors': checksum mismatch in tensor 'h\.0\.mlp\.c_fc\.weight'" \
		"$BIN/dpc-outer" step wide --phase 1 --module lower.0 -q $how
	[ ! -e $w ] || die "a module was written from a corrupted piece ($how)"
done
cp p1.good $p1
echo "4-piece tensors: same bits by piece (1, 3 threads) and by path; a bad third piece caught"

# slices: --slice I/N takes modules I, I+N, ... (in topology order: lower.0 lower.1 upper.0
# upper.1); under mpirun, with neither --module nor --slice, rank I of N takes slice I/N
rm -f again/phase-0003/modules/*.safetensors
env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 "$BIN/dpc-outer" step again --phase 3 -q \
	>out.stdout 2>out.stderr || { cat out.stderr; die "rank 1 of 2 failed"; }
got=$(cd again/phase-0003/modules && ls ./*.safetensors | tr '\n' ' ')
[ "$got" = "./lower.1.safetensors ./upper.1.safetensors " ] || die "rank 1 of 2 made: $got"
expect_ok "$BIN/dpc-outer" step again --phase 3 --slice 0/2 -q
for m in lower.0 lower.1 upper.0 upper.1; do
	same_file "ref/phase-0003/modules/$m.safetensors" "again/phase-0003/modules/$m.safetensors"
done
echo "rank 1 of 2 under mpirun, then --slice 0/2: the four modules, the same bits"

same_run() {
	for m in lower.0 lower.1 upper.0 upper.1; do
		same_file "ref/phase-0003/modules/$m.safetensors" "$1/phase-0003/modules/$m.safetensors"
	done
}

# ---- killed workers: one worker in the middle of its training while the other goes on, then
# the whole make and its workers at several moments; the same command resumes each time ----
run_init k
setsid make -s -C k -j2 >/dev/null 2>&1 &
pid=$!
i=0
while [ $i -lt 1000 ] && ! ls k/phase-0002/paths/*.jsonl.part >/dev/null 2>&1; do
	sleep 0.01; i=$((i + 1))
done
kill_task k "--run \. .*--phase 2 --path" || die "no phase-2 worker to kill"
kills=1
wait "$pid" 2>/dev/null && die "make succeeded although a worker was killed"
outputs() { ls k/phase-*/paths/*.safetensors k/phase-*/modules/*.safetensors 2>/dev/null | wc -l; }
# each round: resume, let one more task finish, kill everything a moment later (0, 0.05 or
# 0.1 s), until 6 kills have hit a running make; a round whose make finished first (several
# tasks done in the moment, on fast cores) is not a kill, and the next round goes on
rounds=0
while [ $kills -lt 6 ] && [ $rounds -lt 20 ]; do
	extra=$(echo "0 0.05 0.1" | cut -d' ' -f$((rounds % 3 + 1)))
	rounds=$((rounds + 1))
	have=$(outputs)
	setsid make -s -C k -j2 >/dev/null 2>&1 &
	pid=$!
	i=0
	while [ $i -lt 2000 ] && [ "$(outputs)" -le "$have" ] && kill -0 "$pid" 2>/dev/null; do
		sleep 0.005; i=$((i + 1))
	done
	sleep "$extra"
	if kill -KILL "-$pid" 2>/dev/null; then kills=$((kills + 1)); fi
	wait "$pid" 2>/dev/null || true
done
[ $kills -ge 4 ] || die "only $kills kills in $rounds rounds hit a running make: the run is too short"
make -s -C k -j2 >/dev/null 2>make.err || { cat make.err; die "the resumed run failed"; }
same_run k
leftover=$(find k -name '*.tmp.*' -o -name '*.part' | head -3)
[ -z "$leftover" ] || die "the resumed run left temporary files: $leftover"
echo "2x2 run killed $kills times under make -j2: final modules bit-identical"

# ---- dpc-outer killed halfway through a step: it has folded path 0 and waits for path 1 -----
run_init o
expect_ok "$BIN/dpc-train-path" -q --run o --phase 1 --path 0
"$BIN/dpc-outer" step o --phase 1 --module lower.0 --wait -q >/dev/null 2>&1 &
opid=$!
sleep 0.3
kill -0 "$opid" 2>/dev/null || die "dpc-outer --wait ended before its paths were trained"
kill -KILL "$opid"
wait "$opid" 2>/dev/null || true
[ -e o/phase-0001/modules/lower.0.safetensors ] && die "a killed outer step left a module"
ls o/phase-0001/modules/ | grep -q tmp && die "a killed outer step left a temporary file"
# --wait finishes the step when the path appears, with the same bits as the run without it
"$BIN/dpc-outer" step o --phase 1 --module lower.0 --wait=60 -q >wait.out 2>&1 &
opid=$!
expect_ok "$BIN/dpc-train-path" -q --run o --phase 1 --path 1
wait "$opid" || { cat wait.out; die "dpc-outer --wait failed"; }
same_file ref/phase-0001/modules/lower.0.safetensors o/phase-0001/modules/lower.0.safetensors
make -s -C o -j2 >/dev/null 2>make.err || { cat make.err; die "the run after the killed step failed"; }
same_run o
echo "outer step killed mid-step and --wait folding paths as they appear: bit-identical"

# ---- the metrics file a user plots ---------------------------------------------------------
n_train=$(grep -c '"event":"path"' ref/metrics.jsonl || true)
n_outer=$(grep -c '"event":"outer"' ref/metrics.jsonl || true)
[ "$n_train" = 12 ] || die "metrics.jsonl has $n_train path events, expected 3 phases x 4 paths"
[ "$n_outer" = 12 ] || die "metrics.jsonl has $n_outer outer events, expected 3 phases x 4 modules"
echo "metrics.jsonl: 12 path summaries, 12 outer diagnostics"
