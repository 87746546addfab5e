# Bad input to a DiPaCo run is refused: the right exit status, one stderr line naming the file
# and the problem, and nothing written. dpc-outer step of phase 1's module lower.0 (paths 0
# and 1) against a damaged or foreign path-001 or phase-0 module; dpc-train-path --run against
# bad options, missing or damaged inputs and an existing output that does not verify; and
# dpc-outer init against a config whose levels do not cover the model or a run directory
# holding another config, and init --from against a checkpoint of another shape or kind and a
# run directory initialised from another source.
set -eu
. "$TESTDIR/lib.sh"
. "$TESTDIR/corpus.sh"
cfgdir=$TESTDIR/../../configs
PY=/usr/bin/python3
O=$BIN/dpc-outer
T=$BIN/dpc-train-path
[ -x "$PY" ] || skip "skipped: $PY missing (it crafts the damaged checkpoints)"
make_corpus c.jsonl 60
expect_ok "$BIN/dpc-shard" prepare --val-frac 0.1 --router-frac 0 c.jsonl d
small="-s model.n_embd=32 -s model.n_head=2 -s model.seq_len=32 -s train.batch_size=2
       -s train.warmup_steps=2 -s train.eval_batches=1 -s dipaco.phases=2
       -s dipaco.inner_steps=4 -s train.steps=8"
# run_init DIR CONFIG [-s K=V]...: a run directory of CONFIG with the small model, and shards
run_init() {
	dir=$1 cfg=$2
	shift 2
	# shellcheck disable=SC2086
	expect_ok "$O" init -c "$cfgdir/$cfg" $small "$@" "$dir"
	expect_ok "$BIN/dpc-shard" split -q --random 4 --seed 3 d/train.tok "$dir/shards"
}
# flip FILE TENSOR: xor one byte in the middle of TENSOR's data (its offset from the header)
flip() {
	"$PY" - "$1" "$2" <<'EOF'
import json, struct, sys
path, name = sys.argv[1:3]
raw = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
a, b = json.loads(raw[8:8 + n])[name]["data_offsets"]
raw[8 + n + (a + b) // 2] ^= 0x10
open(path, "wb").write(raw)
EOF
}
# snapshot DIR: every file of DIR with its checksum and size, sorted
snapshot() { find "$1" -type f | LC_ALL=C sort | xargs cksum; }

run_init R dipaco-2x2.yaml
mods=R/phase-0000/modules
paths1=R/phase-0001/paths

# ---- dpc-train-path --run: options ---------------------------------------------------------
expect_fail 2 "^dpc-train-path: .*--phase.*0" "$T" -q --run R --phase 0 --path 0
expect_fail 2 "^dpc-train-path: 'R': phase 3 is outside 1\.\.2$" "$T" -q --run R --phase 3 --path 0
expect_fail 2 "^dpc-train-path: 'R': path 4 is outside 0\.\.3$" "$T" -q --run R --phase 1 --path 4
# (the message lists the options that go with --run; it does not name the one given)
only="^dpc-train-path: --run .*only --phase"
expect_fail 2 "$only" "$T" -q --run R --phase 1 --path 0 -o x.safetensors
expect_fail 2 "$only" "$T" -q --run R --phase 1 --path 0 -c "$cfgdir/dipaco-2x2.yaml"
expect_fail 2 "$only" "$T" -q --run=R --phase=1 --path=0 --out=x.safetensors
[ ! -e x.safetensors ] || die "dpc-train-path --run -o wrote its -o"
mkdir norun
expect_fail 1 "^dpc-train-path: 'norun': .*config\.yaml" "$T" -q --run norun --phase 1 --path 0
expect_fail 1 "^dpc-outer: 'norun': .*config\.yaml" "$O" step norun --phase 1 --module lower.0 -q
[ -z "$(ls norun)" ] || die "a run directory without config.yaml got files: $(ls norun)"

# ---- dpc-train-path --run: missing or damaged inputs; nothing written ----------------------
nothing_of() {  # nothing_of P: no checkpoint, metrics or temporary file of path P in phase 1
	left=$(find R -path "*/phase-0001/paths/path-00$1*")
	[ -z "$left" ] || die "a failed training task of path $1 left: $left"
}
mv R/shards/shard-002.tok shard-002.tok
expect_fail 1 "^dpc-train-path: 'R/shards/shard-002\.tok': .*(no such file|does not exist|missing)" \
	"$T" -q --run R --phase 1 --path 2
nothing_of 2
head -c 1000 shard-002.tok >R/shards/shard-002.tok
expect_fail 1 "^dpc-train-path: 'R/shards/shard-002\.tok': .*truncated" \
	"$T" -q --run R --phase 1 --path 2
nothing_of 2
mv shard-002.tok R/shards/shard-002.tok
# path 3 uses lower.1 and upper.1 of phase 0
cp $mods/upper.1.safetensors upper.1.good
head -c 5000 upper.1.good >$mods/upper.1.safetensors
expect_fail 1 "^dpc-train-path: '$mods/upper\.1\.safetensors': .*truncated" \
	"$T" -q --run R --phase 1 --path 3
nothing_of 3
cp upper.1.good $mods/upper.1.safetensors
flip $mods/upper.1.safetensors h.3.mlp.c_fc.weight
expect_fail 1 "^dpc-train-path: '$mods/upper\.1\.safetensors': .*checksum" \
	"$T" -q --run R --phase 1 --path 3
nothing_of 3
cp $mods/upper.0.safetensors $mods/upper.1.safetensors
expect_fail 1 "^dpc-train-path: '$mods/upper\.1\.safetensors': .*upper\.0" \
	"$T" -q --run R --phase 1 --path 3
nothing_of 3
cp upper.1.good $mods/upper.1.safetensors
echo "dpc-train-path --run: bad options, no config.yaml, damaged shard and module refused"

# ---- phase 1 trained; dpc-outer step of lower.0 against bad inputs -------------------------
for p in 0 1 2 3; do expect_ok "$T" -q --run R --phase 1 --path $p; done
good=$paths1/path-001.safetensors
cp $good path-001.good
cp $mods/lower.0.safetensors lower.0.good

# an existing output that does not verify is refused and left as it was
flip $good h.2.attn.c_proj.weight
cp $good flipped.safetensors
expect_fail 1 "^dpc-train-path: '$good': .*(remove|delete)" "$T" -q --run R --phase 1 --path 1
same_file flipped.safetensors $good
cp path-001.good $good
echo "dpc-train-path --run: an existing output that does not verify is refused, untouched"

# the foreign checkpoints: phase 2 of the same run, another lr, two other topologies, and the
# same model trained outside any run
cp -r R R2
expect_ok "$O" step R2 --phase 1 -q
expect_ok "$T" -q --run R2 --phase 2 --path 1
cp R2/phase-0002/paths/path-001.safetensors phase2.safetensors
run_init Rlr dipaco-2x2.yaml -s train.lr=1e-3
expect_ok "$T" -q --run Rlr --phase 1 --path 1
run_init Rhead dipaco-2x2-head.yaml
expect_ok "$T" -q --run Rhead --phase 1 --path 1
run_init Rmoe flat-moe.yaml
expect_ok "$T" -q --run Rmoe --phase 1 --path 1
# Trained from R's own config.yaml on path 1's shard for the phase's 4 steps: the same config
# hash, the same bits as path-001 (phase 1 starts from the seeded init, as a dense run does),
# so the missing phase / path metadata is the only defect.
expect_ok "$T" -q -c R/config.yaml -d R/shards/shard-001.tok -u 4 -o plain.safetensors
"$PY" "$TESTDIR/stcmp.py" path-001.good plain.safetensors >/dev/null ||
	die "the plain checkpoint is not path 1's phase-1 parameters: case 10 would test more"

step_fails() {  # step_fails WHAT PATTERN: the outer step of lower.0 is refused, nothing written
	expect_fail 1 "$2" "$O" step R --phase 1 --module lower.0 -q
	[ ! -e R/phase-0001/modules/lower.0.safetensors ] || die "$1: the failed step wrote lower.0"
	[ ! -e R/phase-0001/modules/lower.0.json ] || die "$1: the failed step wrote lower.0.json"
	left=$(find R/phase-0001/modules -name 'lower.0*.tmp.*')
	[ -z "$left" ] || die "$1: the failed step left $left"
	cp path-001.good $good
	cp lower.0.good $mods/lower.0.safetensors
	echo "refused: $1: $(cat out.stderr)"
}
q="^dpc-outer: '$paths1/path-001\.safetensors': "
rm $good
step_fails "1 missing path" "$q.*does not exist"
head -c $(($(wc -c <path-001.good) / 2)) path-001.good >$good
step_fails "2 truncated" "$q.*truncated"
flip $good h.0.mlp.c_fc.weight
step_fails "3 a byte flipped" "$q.*checksum mismatch.*h\.0\.mlp\.c_fc\.weight"
cp phase2.safetensors $good
step_fails "4 of phase 2" "$q.*phase 2.*phase 1"
cp Rlr/phase-0001/paths/path-001.safetensors $good
step_fails "5 of another lr" "$q.*(another|other) config"
cp Rhead/phase-0001/paths/path-001.safetensors $good
step_fails "6 of dipaco-2x2-head" "$q.*(another|other) (config|topology)"
cp Rmoe/phase-0001/paths/path-001.safetensors $good
step_fails "6 of flat-moe" "$q.*(another|other) (config|topology)"
"$PY" "$TESTDIR/stedit.py" path-001.good $good reshape h.0.mlp.c_fc.weight 64 64
step_fails "7 a reshaped tensor" "$q.*h\.0\.mlp\.c_fc\.weight.*shape"
"$PY" "$TESTDIR/stedit.py" path-001.good $good nan h.1.attn.c_attn.bias
step_fails "8 NaN" "$q.*h\.1\.attn\.c_attn\.bias.*(non-finite|not finite|NaN)"
cp $paths1/path-000.safetensors $good
step_fails "path 0 as path 1" "$q.*path 0.*path 1"
cp plain.safetensors $good
step_fails "10 a plain GPT-2 checkpoint" "$q.*phase"
qm="^dpc-outer: '$mods/lower\.0\.safetensors': "
flip $mods/lower.0.safetensors wte.weight
step_fails "9 phase-0 module, a byte flipped" "$qm.*checksum"
head -c 3000 lower.0.good >$mods/lower.0.safetensors
step_fails "9 phase-0 module truncated" "$qm.*truncated"
cp $mods/upper.0.safetensors $mods/lower.0.safetensors
step_fails "9 upper.0 as lower.0" "$qm.*upper\.0.*lower\.0"
cp $mods/lower.1.safetensors $mods/lower.0.safetensors
step_fails "9 lower.1 as lower.0" "$qm.*lower\.1.*lower\.0"
# and the good inputs still step (the cases above did not pass for some other reason)
expect_ok "$O" step R --phase 1 --module lower.0 -q
[ -e R/phase-0001/modules/lower.0.safetensors ] || die "the good step wrote no lower.0"
# an output that exists but does not verify: refused, named, left as it was
flip R/phase-0001/modules/lower.0.safetensors h.1.mlp.c_proj.weight
cp R/phase-0001/modules/lower.0.safetensors lower.0.flipped
expect_fail 1 "^dpc-outer: 'R/phase-0001/modules/lower\.0\.safetensors': .*(remove|delete)" \
	"$O" step R --phase 1 --module lower.0 -q
same_file lower.0.flipped R/phase-0001/modules/lower.0.safetensors
echo "dpc-outer step: every bad input refused with one line, nothing written"

# ---- dpc-outer init ------------------------------------------------------------------------
# n_layer 6: dipaco-2x2's levels own blocks 0-3 only
expect_fail 2 "^dpc-outer: .*dipaco-2x2\.yaml.*h\.[45]" "$O" init -c "$cfgdir/dipaco-2x2.yaml" \
	-s model.n_layer=6 N
left=$(ls -d N* 2>/dev/null || true)
[ -z "$left" ] || die "init of an uncovered model created files: $left"
mkdir N
expect_fail 2 "^dpc-outer: .*h\.[45]" "$O" init -c "$cfgdir/dipaco-2x2.yaml" -s model.n_layer=6 N
[ -z "$(ls -A N)" ] || die "init of an uncovered model wrote into N: $(ls -A N)"
# R holds another config (the lr differs): refused, no byte changed
snapshot R >R.before
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'R/config\.yaml': .*another config" "$O" init \
	-c "$cfgdir/dipaco-2x2.yaml" $small -s train.lr=1e-3 R
snapshot R >R.after
cmp -s R.before R.after || { diff R.before R.after; die "init with another config changed R"; }
echo "dpc-outer init: levels not covering the model, a directory of another config: refused"

# ---- dpc-outer init --from -----------------------------------------------------------------
# shellcheck disable=SC2086
expect_ok "$T" -q -c "$cfgdir/dense.yaml" $small -s train.steps=8 -s train.eval_every=0 \
	-d d/train.tok -o base.st
# another width, another vocabulary, a module file: one line each, exit 2, nothing made
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'base\.st': is a model of L=4 C=32 NH=2 T=32 V=256, the run's config says L=4 C=64 NH=2 T=32 V=256$" \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small -s model.n_embd=64 --from base.st F
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'base\.st': is a model of .* V=256, the run's config says .* V=300$" \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small -s model.vocab_size=300 --from base.st F
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: '$mods/lower\.0\.safetensors': is a module checkpoint, not a model's" \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from "$mods/lower.0.safetensors" F
[ ! -e F ] || die "a refused init --from made F"
# shellcheck disable=SC2086
expect_ok "$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st F
grep -q '"init":"checkpoint [0-9a-f]\{8\}"' out.stdout || die "init --from: $(cat out.stdout)"
grep -q '"modules_written":4' out.stdout || die "init --from: $(cat out.stdout)"
# the same run directory from the seed, or from another checkpoint: refused, no byte changed
snapshot F >F.before
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'F/phase-0000/modules/[a-z0-9.]*\.safetensors': was initialised from checkpoint [0-9a-f]{8}, not from seed 1 " \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small F
# shellcheck disable=SC2086
expect_ok "$T" -q -c "$cfgdir/dense.yaml" $small -s train.steps=8 -s train.seed=2 -s train.eval_every=0 \
	-d d/train.tok -o base2.st
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'F/phase-0000/modules/[a-z0-9.]*\.safetensors': was initialised from checkpoint [0-9a-f]{8}, not from checkpoint [0-9a-f]{8} " \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base2.st F
snapshot F >F.after
cmp -s F.before F.after || { diff F.before F.after; die "a refused init changed F"; }
# shellcheck disable=SC2086
expect_ok "$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st F
grep -q '"modules_written":0' out.stdout || die "init --from again: $(cat out.stdout)"
# --moments: without --from a usage error; a checkpoint without AdamW state refused; the same
# checkpoint with and without the moments are two sources (a rerun of either is refused)
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: init: --moments takes the AdamW moments of --from's checkpoint" \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --moments G
python3 "$TESTDIR/stedit.py" base.st noopt.st params-only - || die "stedit.py params-only failed"
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'noopt\.st': holds no AdamW moments to start the paths from" \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from noopt.st --moments G
[ ! -e G ] || die "a refused init --moments made G"
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'F/phase-0000/modules/[a-z0-9.]*\.safetensors': was initialised from checkpoint [0-9a-f]{8}, not from checkpoint [0-9a-f]{8} moments of step 8 " \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st --moments F
[ ! -e F/phase-0000/moments.safetensors ] || die "a refused init --moments wrote the moments"
# shellcheck disable=SC2086
expect_ok "$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st --moments G
grep -q '"init":"checkpoint [0-9a-f]\{8\} moments of step 8"' out.stdout ||
	die "init --moments: $(cat out.stdout)"
same_file base.st G/phase-0000/moments.safetensors
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'G/phase-0000/modules/[a-z0-9.]*\.safetensors': was initialised from checkpoint [0-9a-f]{8} moments of step 8, not from checkpoint [0-9a-f]{8} " \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st G
# a copy that was damaged after init: the rerun says so instead of keeping it
python3 "$TESTDIR/stedit.py" base2.st G/phase-0000/moments.safetensors scale ln_f.weight 1 ||
	die "stedit.py failed"
# shellcheck disable=SC2086
expect_fail 2 "^dpc-outer: 'G/phase-0000/moments\.safetensors': is checkpoint [0-9a-f]{8} moments of step 8, not checkpoint [0-9a-f]{8} moments of step 8 " \
	"$O" init -c "$cfgdir/dipaco-2x2.yaml" $small --from base.st --moments G
echo "dpc-outer init --from: another shape, vocabulary or kind refused; another source refused on a rerun; --moments checked"

# ---- dpc-shard split --run: the run's path count and shard folder -----------------------
# shellcheck disable=SC2086
expect_ok "$O" init -c "$cfgdir/dipaco-2x2.yaml" $small H
expect_ok "$BIN/dpc-shard" split -q --run H d/train.tok
expect_ok "$BIN/dpc-shard" split -q --random 4 d/train.tok Href
for f in shards.json shard-000.tok shard-001.tok shard-002.tok shard-003.tok; do
	same_file H/shards/$f Href/$f
done
expect_fail 2 "^dpc-shard: 'H/phase-0001/modules/lower\.0\.safetensors': does not exist: phase 1 has not finished, so there is nothing to re-shard after yet$" \
	"$BIN/dpc-shard" split -q --run H --after-phase 1 d/train.tok
expect_fail 2 "^dpc-shard: 'H': has phases 1\.\.2: a re-sharding goes after phase 1 to 1, not 2$" \
	"$BIN/dpc-shard" split -q --run H --after-phase 2 d/train.tok
expect_fail 2 "^dpc-shard: split: --random 3, but run 'H' has 4 paths \(with --run, leave --random out\)$" \
	"$BIN/dpc-shard" split -q --run H --random 3 d/train.tok
expect_fail 2 "^dpc-shard: split: with --run, expected IN\.tok alone \(the run names OUTDIR\), got 2 arguments" \
	"$BIN/dpc-shard" split -q --run H d/train.tok H/shards
expect_fail 2 "^dpc-shard: split: --after-phase goes with --run$" \
	"$BIN/dpc-shard" split -q --after-phase 1 --random 4 d/train.tok Hx
echo "dpc-shard split --run: the same shards as --random P into RUNDIR/shards; bad phases and counts refused"

# ---- a value that is not finite in a module of phase t-1 (checksums right: stedit.py) ------
# A path checkpoint with a NaN is refused (case 8); the same NaN in the module the step starts
# from, or in one a training task assembles, must be refused too, naming that module. Last,
# each in a subshell, so that every check above has run and both cases report.
bad=""
rm -f R/phase-0001/modules/lower.0.*
"$PY" "$TESTDIR/stedit.py" lower.0.good $mods/lower.0.safetensors nan wte.weight
(step_fails "9 NaN in the phase-0 module" "$qm.*wte\.weight.*(non-finite|not finite|NaN)") ||
	bad="$bad; dpc-outer step with a NaN in phase-0000/modules/lower.0"
cp lower.0.good $mods/lower.0.safetensors
m1=R2/phase-0001/modules/upper.0.safetensors
cp $m1 upper.0.good
"$PY" "$TESTDIR/stedit.py" upper.0.good $m1 nan h.2.attn.c_attn.weight
qm1="^dpc-train-path: 'R2/phase-0001/modules/upper\.0\.safetensors': "
(expect_fail 1 "$qm1.*h\.2\.attn\.c_attn\.weight.*(non-finite|not finite|NaN)" \
	"$T" -q --run R2 --phase 2 --path 0 && echo "refused: $(cat out.stderr)") ||
	bad="$bad; dpc-train-path --run with a NaN in phase-0001/modules/upper.0"
left=$(find R2 -path "*/phase-0002/paths/path-000*")
[ -z "$left" ] || bad="$bad; the failed training task left $left"
cp upper.0.good $m1
[ -z "$bad" ] || die "not refused as they should be:${bad#;}"
echo "a NaN in a module of phase t-1: refused by the outer step and by training"
