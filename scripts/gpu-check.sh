#!/bin/sh
# gpu-check.sh - every GPU test and the GPU benchmarks of the CUDA backend, in one run, with one
# summary table at the end. Runs on the GPU machine from a pack made by scripts/gpu-pack.sh
# (nothing is built there and nothing is installed: the machine needs the NVIDIA driver,
# cuBLAS 13 and python3 with torch and numpy).
#
#   sh scripts/gpu-check.sh [--pack DIR] [--out DIR] [--quick]
#
# Checks (each one PASS or FAIL in the table):
#   backend ops    test_backend: every op of the backend table on cuda against the reference
#                  backend, at many shapes, aligned and misaligned, plus one GPT-2 training
#                  step and one MoE layer step compared tensor by tensor
#   nccl self      test_backend's comm_self_round: the real NCCL (libnccl.so.2 of the
#                  machine or of its Python's nvidia-nccl package) on a communicator of one
#                  process, rounds of sends and receives with itself (SKIP without NCCL); the
#                  multi-process All-to-All needs several GPUs (test/mpi/test_dist_dev.c)
#   fused attention
#                  test_backend's attention cases and GPT-2 step with CORE_CUDA_ATTENTION=fused
#                  (kernels/attention.cu), and the 50 training steps again with it
#   moe layer      test_moe on the GPU machine's CPU (the layer itself; the cuda layer step is
#                  in test_backend)
#   sanitizer      compute-sanitizer memcheck over a small moe-bench step and 2 training steps
#   train 50       dpc-train-path, gpt-tiny, 50 steps on Brown on cpu and on cuda: every step's
#                  loss within 1e-3 relative
#   train 50 tf32, bf16
#                  the same on cuda with --precision tf32 and bf16 against the cpu's fp32 run:
#                  every step's loss within 1e-2 (tf32) and 3e-2 (bf16) relative, a sanity
#                  bound (test_backend checks the rounding itself exactly)
# Benchmarks (each with its ratio):
#   encode+decode  moe-bench --only=encode-decode at T=65536 M=2048 E=64 k=2: GB/s against a
#                  device copy of as many bytes in the same run (target >= 0.90), in fp32 and
#                  with --dtype bf16 (the bfloat16 kernels, half the bytes)
#   moe layer      moe-bench forward+backward against the same layer in PyTorch on the same GPU
#                  (test/gpu/torch_moe_bench.py, eager and torch.compile): at least 1.2x the
#                  faster of the two, in fp32 and in bf16 (ours --precision bf16, torch's layer
#                  --dtype bfloat16; with the ratio to our fp32 layer)
#   training       dpc-train-path tokens/s, L=12 C=768 T=1024 vocab 256 B=8, against PyTorch
#                  eager and torch.compile (test/gpu/torch_gpt2_bench.py), each with the manual
#                  attention and sdpa, in each precision: fp32 (no TF32), tf32 (torch: TF32
#                  allowed) and bf16 (torch: autocast to bfloat16); fp32 and bf16 must be at
#                  least torch's best run in the same precision, tf32 at least its eager/manual
#   overlap        the distributed layer on one GPU (W = 1: each exchange a copy to itself) at
#                  d = 2 and 4, its exchanges on the second stream (default) and in order with
#                  the experts (--no-overlap): PASS when every step's loss is the same in the
#                  two; the share of the exchange time hidden, (no-overlap - overlap) over the
#                  exchange time of a --stage-times run, is measured (no verdict)
#   attention      training tokens/s (fp32, the size above) with the cuBLAS attention and
#                  with CORE_CUDA_ATTENTION=fused (a ratio, no verdict: the default is chosen
#                  from it)
# Raw outputs are kept in --out (default /tmp/gpu-check); the whole run takes 4-6 minutes on an
# H200 (--quick: small sizes, about a minute).
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
pack=$here/.gpu
out=/tmp/gpu-check
quick=0
while [ $# -gt 0 ]; do
	case $1 in
	--pack) pack=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	-h|--help) sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//; /^set -u/d'; exit 0 ;;
	*) echo "gpu-check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
	esac
done
[ -s "$pack/pack.tar.gz" ] || { echo "gpu-check.sh: '$pack/pack.tar.gz': no pack here (run scripts/gpu-pack.sh where the project builds)" >&2; exit 2; }
mkdir -p "$out"
# unpacked once per pack: a rerun with the same pack starts at once
unpacked=/tmp/gpu-check-pack
if ! cmp -s "$pack/pack.tar.gz" "$unpacked/pack.tar.gz" 2>/dev/null; then
	rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xzf "$pack/pack.tar.gz" &&
		cp "$pack/pack.tar.gz" "$unpacked/" ||
		{ echo "gpu-check.sh: cannot unpack '$pack/pack.tar.gz'" >&2; exit 1; }
fi
pack=$unpacked
PY=${PY:-python3}
summary=$out/summary.txt
: >"$summary"
row() { printf '%-16s %-5s %s\n' "$1" "$2" "$3" | tee -a "$summary"; }
# The last line of a check's output as "PASS ..." or "FAIL ...": anything else (a traceback's
# last line) is a FAIL naming the raw files to read.
verdict() {
	v=$(tail -n 1)
	case $v in PASS*|FAIL*|INFO*) echo "$v" ;; *) echo "FAIL $v (see $out/$1*)" ;; esac
}
t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 )) s] $*" >&2; }

# cuBLAS: the machine's own, wherever its CUDA 13 lives
cublas_dir=
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
	"$($PY -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)"; do
	[ -n "$d" ] && [ -e "$d/libcublas.so.13" ] && { cublas_dir=$d; break; }
done
[ -n "$cublas_dir" ] || cublas_dir=$(dirname "$(ldconfig -p | awk '/libcublas.so.13 / { print $NF; exit }')" 2>/dev/null)
# NCCL, loaded by the backend when a communicator is first made: the machine's, or torch's
nccl_dir=
for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
	"$($PY -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)"; do
	[ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { nccl_dir=$d; break; }
done
export LD_LIBRARY_PATH="$pack/lib${cublas_dir:+:$cublas_dir}${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
stamp "GPU: $(cat "$out/gpu.txt"); cuBLAS from ${cublas_dir:-nowhere}; NCCL from ${nccl_dir:-nowhere}; $(nproc) CPUs"

B=$pack/bin
# ---- correctness -------------------------------------------------------------------------
stamp "test_backend (cuda against ref)"
timeout 300 "$pack/test/test_backend" --jobs=4 >"$out/test_backend.log" 2>&1
rc=$?
ops=$(grep -c "on 'cuda'" "$out/test_backend.log")
worst=$(grep "on 'cuda'" "$out/test_backend.log" | sed 's/.*test_backend: //' | tr '\n' ';' | cut -c1-400)
if [ $rc = 0 ] && [ "$ops" -gt 0 ]; then row "backend ops" PASS "$ops tests on cuda; $(grep -c SKIPPED "$out/test_backend.log") skipped"; else row "backend ops" FAIL "rc $rc, $ops cuda lines (test_backend.log)"; fi
echo "$worst" | tr ';' '\n' >>"$out/backend_summary.txt"
if grep -q "comm_self_round on 'cuda'" "$out/test_backend.log"; then
	row "nccl self" PASS "$(grep "comm_self_round on 'cuda'" "$out/test_backend.log" | sed 's/.*: //')"
elif grep -q "comm_self_round: SKIPPED" "$out/test_backend.log"; then
	row "nccl self" SKIP "$(grep "comm_self_round: SKIPPED" "$out/test_backend.log" | sed 's/.*SKIPPED //' | cut -c1-200)"
else
	row "nccl self" FAIL "no comm_self_round line (test_backend.log)"
fi

stamp "test_backend, fused attention"
CORE_CUDA_ATTENTION=fused timeout 300 "$pack/test/test_backend" --jobs=4 \
	--filter 'backend/@(attention|gpt2_training_step|reduced_precision_products)' >"$out/test_backend_fused.log" 2>&1
rc=$?
fa=$(grep -c "on 'cuda'" "$out/test_backend_fused.log")
if [ $rc = 0 ] && [ "$fa" -gt 0 ]; then row "fused attention" PASS "$(grep "attention on 'cuda'" "$out/test_backend_fused.log" | sed 's/.*: //' | cut -c1-160)"; else row "fused attention" FAIL "rc $rc, $fa cuda lines (test_backend_fused.log)"; fi

stamp "test_moe"
timeout 120 "$pack/test/test_moe" --jobs=4 >"$out/test_moe.log" 2>&1
rc=$?
if [ $rc = 0 ]; then row "moe layer (cpu)" PASS "test_moe"; else row "moe layer (cpu)" FAIL "rc $rc (test_moe.log)"; fi

stamp "compute-sanitizer"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
	timeout 120 $san --tool memcheck --error-exitcode 9 "$B/moe-bench" --device cuda -T 1000 -M 64 -H 96 \
		-E 6 -k 2 -n 1 -w 0 --bpr >"$out/san_moe.log" 2>&1
	r1=$?
	timeout 120 $san --tool memcheck --error-exitcode 9 "$B/moe-bench" --device cuda -T 777 -M 33 -H 50 \
		-E 5 -k 3 -n 1 -w 0 --gate-noise 1 --aux-loss load-importance --activation gelu \
		--capacity 0.5 >>"$out/san_moe.log" 2>&1
	r2=$?
	# the bfloat16 dispatch kernels: M=33 the scalar path, M=64 the vector one
	for m in 33 64; do
		timeout 120 $san --tool memcheck --error-exitcode 9 "$B/moe-bench" --device cuda --only=encode-decode \
			--dtype bf16 -T 777 -M $m -E 5 -k 3 -n 1 -w 0 >>"$out/san_moe.log" 2>&1 || r2=$?
	done
	timeout 120 $san --tool memcheck --error-exitcode 9 "$B/dpc-train-path" --device cuda -f \
		-c "$here/configs/gpt-tiny.yaml" -s train.steps=2 -s train.eval_every=0 \
		-s model.n_layer=2 -s model.seq_len=64 -s train.batch_size=3 \
		-d "$pack/data/val.tok" -o "$out/san.safetensors" -q >"$out/san_train.log" 2>&1
	r3=$?
	if [ $r1$r2$r3 = 000 ]; then row "sanitizer" PASS "memcheck: 2 moe-bench steps, 2 bf16 encode-decode steps, 2 training steps, no error"; else row "sanitizer" FAIL "exit $r1 $r2 $r3 (san_*.log)"; fi
else
	row "sanitizer" SKIP "no compute-sanitizer here"
fi

stamp "train 50 steps on cpu and cuda"
for dev in cpu cuda; do
	rm -f "$out/train50-$dev.jsonl"
	timeout 300 "$B/dpc-train-path" --device $dev -f -c "$here/configs/gpt-tiny.yaml" -s train.steps=50 \
		-s train.eval_every=0 -s train.checkpoint_every=0 -d "$pack/data/val.tok" \
		-o "$out/train50-$dev.safetensors" -m "$out/train50-$dev.jsonl" -q \
		>"$out/train50-$dev.json" 2>"$out/train50-$dev.err"
done
$PY - "$out" <<'EOF' >"$out/train50.txt" 2>&1
import json, sys
out = sys.argv[1]
def losses(dev):
    return [json.loads(l)["loss"] for l in open(f"{out}/train50-{dev}.jsonl") if '"event":"train"' in l]
a, b = losses("cpu"), losses("cuda")
assert len(a) == 50 and len(b) == 50, (len(a), len(b))
rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
tc = json.load(open(f"{out}/train50-cpu.json"))["tokens_per_s"]
tg = json.load(open(f"{out}/train50-cuda.json"))["tokens_per_s"]
print(f"{'PASS' if rel <= 1e-3 else 'FAIL'} max rel diff {rel:.2e} over 50 steps (loss {a[0]:.4f} -> {a[-1]:.4f} cpu, {b[-1]:.4f} cuda); {tc:.0f} vs {tg:.0f} tok/s")
EOF
res=$(verdict train50 <"$out/train50.txt")
row "train 50 steps" "${res%% *}" "${res#* }"

# Reduced precision: the same 50 steps on cuda against the cpu's fp32 losses.
for prec in tf32 bf16 fused; do
	stamp "train 50 steps on cuda, $prec"
	rm -f "$out/train50-$prec.jsonl"
	pflag="--precision $prec" attn=cublas
	[ $prec = fused ] && pflag= attn=fused
	CORE_CUDA_ATTENTION=$attn timeout 300 "$B/dpc-train-path" --device cuda $pflag -f -c "$here/configs/gpt-tiny.yaml" \
		-s train.steps=50 -s train.eval_every=0 -s train.checkpoint_every=0 -d "$pack/data/val.tok" \
		-o "$out/train50-$prec.safetensors" -m "$out/train50-$prec.jsonl" -q \
		>"$out/train50-$prec.json" 2>"$out/train50-$prec.err"
	$PY - "$out" $prec <<'EOF' >"$out/train50-$prec.txt" 2>&1
import json, sys
out, prec = sys.argv[1], sys.argv[2]
bound = {"tf32": 1e-2, "bf16": 3e-2, "fused": 1e-3}[prec]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{out}/train50-{name}.jsonl") if '"event":"train"' in l]
a, b = losses("cpu"), losses(prec)
assert len(a) == 50 and len(b) == 50, (len(a), len(b))
rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
j = json.load(open(f"{out}/train50-{prec}.json"))
assert j.get("precision") == (prec if prec != "fused" else "fp32"), j
print(f"{'PASS' if rel <= bound else 'FAIL'} max rel diff {rel:.2e} from cpu fp32 (bound {bound:g}); loss {a[-1]:.4f} cpu, {b[-1]:.4f} {prec}")
EOF
	res=$(verdict train50-$prec <"$out/train50-$prec.txt")
	row "train 50 $prec" "${res%% *}" "${res#* }"
done

# ---- speed -------------------------------------------------------------------------------
if [ $quick = 1 ]; then
	ED="-T 8192 -M 512 -E 16"; LY="-T 4096 -M 512 -H 1024 -E 8"; TR="-s model.n_layer=2"; IT=3
	OV="-T 4096 -M 1024 -H 64 -E 8"
else
	ED="-T 65536 -M 2048 -E 64"; LY="-T 16384 -M 2048 -H 2048 -E 16"; TR=""; IT=10
	OV="-T 16384 -M 2048 -H 64 -E 16"
fi
for dt in fp32 bf16; do
	sfx=; dflag=; [ $dt = bf16 ] && sfx=-bf16 dflag="--dtype bf16"
	stamp "encode+decode $dt"
	"$B/moe-bench" --device cuda --only=encode-decode $dflag $ED -k 2 -n $IT -w 3 >"$out/encdec$sfx.json" 2>"$out/encdec$sfx.err"
	ed=$($PY -c 'import json,sys; j=json.load(open(sys.argv[1])); r=j["encdec_gbps"]/j["copy_gbps"]; print(("PASS" if r>=0.9 else "FAIL"), "%.0f GB/s, copy %.0f GB/s, ratio %.2f (target 0.90)" % (j["encdec_gbps"], j["copy_gbps"], r))' "$out/encdec$sfx.json" 2>&1 | verdict encdec$sfx)
	row "encode+decode $dt" "${ed%% *}" "${ed#* }"
done

for prec in fp32 bf16; do
	sfx=; pflag=; tflag=; [ $prec = bf16 ] && sfx=-bf16 pflag="--precision bf16" tflag="--dtype bfloat16"
	stamp "moe layer $prec: ours and PyTorch"
	"$B/moe-bench" --device cuda $pflag $LY -k 2 -n $IT -w 3 >"$out/layer$sfx.json" 2>"$out/layer$sfx.err"
	timeout 120 $PY "$here/test/gpu/torch_moe_bench.py" $LY -k 2 $tflag --iters $IT --warmup 3 \
		>"$out/layer_torch$sfx.json" 2>"$out/layer_torch$sfx.err"
	ly=$( ($PY - "$out" "$prec" "$sfx" <<'EOF'
import json, sys
out, prec, sfx = sys.argv[1:4]
ours = json.load(open(f"{out}/layer{sfx}.json"))["step_ms"]["median"]
t = json.load(open(f"{out}/layer_torch{sfx}.json"))
runs = {r["mode"]: r.get("step_ms") for r in t["runs"]}
best = min(v for v in runs.values() if v)
parts = ", ".join(f"torch {prec} {m} {v:.2f} ms ({v / ours:.2f}x)" for m, v in runs.items() if v)
vs32 = ""
if sfx:
    fp32 = json.load(open(f"{out}/layer.json"))["step_ms"]["median"]
    vs32 = f" ({fp32 / ours:.2f}x our fp32)"
print(("PASS" if best / ours >= 1.2 else "FAIL"), f"ours {ours:.2f} ms{vs32}, {best / ours:.2f}x the faster torch run (target 1.2); {parts}")
EOF
	) 2>&1 | verdict layer$sfx)
	row "moe layer $prec" "${ly%% *}" "${ly#* }"
done

# The overlap: H small, so that the exchanges (bytes ~ E C M) weigh against the GEMMs
# (flops ~ E C M H); --print-steps gives every step's loss, for the equality
for d in 2 4; do
	stamp "overlap, d = $d"
	for v in ov noov timed; do
		f=; [ $v = noov ] && f=--no-overlap; [ $v = timed ] && f=--stage-times
		timeout 120 "$B/moe-bench" --device cuda $OV -k 2 --r 1 --d $d -n $((IT * 2)) -w 3 \
			--print-steps $f >"$out/overlap$d-$v.json" 2>"$out/overlap$d-$v.err"
	done
	ov=$( ($PY - "$out" $d <<'EOF'
import json, sys
out, d = sys.argv[1], sys.argv[2]
def run(v):
    j = json.loads(open(f"{out}/overlap{d}-{v}.json").read().strip().splitlines()[-1])
    loss = [l.split(",")[0] for l in open(f"{out}/overlap{d}-{v}.err") if l.startswith("STEP-")]
    return j, loss
a, la = run("ov"); b, lb = run("noov"); t, lt = run("timed")
assert la and la == lb == lt, ("losses differ", la[:2], lb[:2], lt[:2])
so, sn, comm = a["step_ms"]["median"], b["step_ms"]["median"], t["comm_ms"]
hidden = (sn - so) / comm
print(f"PASS d={d}: losses equal over {len(la)} steps; step {so:.3f} ms overlapped, {sn:.3f} ms "
      f"in order, exchanges {comm:.3f} ms (timed run {t['step_ms']['median']:.3f} ms): "
      f"{100 * hidden:.0f}% of the exchange time hidden")
EOF
	) 2>&1 | verdict overlap$d)
	row "overlap d=$d" "${ov%% *}" "${ov#* }"
done

TL=12; [ $quick = 1 ] && TL=2
for prec in fp32 tf32 bf16; do
	stamp "training throughput, $prec: ours and PyTorch"
	sfx=; [ $prec = fp32 ] || sfx=-$prec
	timeout 300 "$B/dpc-train-path" --device cuda --precision $prec -f -c "$here/configs/gpt-tiny.yaml" \
		-s model.n_layer=12 -s model.n_embd=768 -s model.n_head=12 -s model.seq_len=1024 \
		-s train.batch_size=8 -s train.steps=$IT -s train.eval_every=0 -s train.checkpoint_every=0 $TR \
		-d "$pack/data/val.tok" -o "$out/big$sfx.safetensors" -m "$out/big$sfx.jsonl" -q \
		>"$out/big$sfx.json" 2>"$out/big$sfx.err"
	tflag=; [ $prec = tf32 ] && tflag=--tf32; [ $prec = bf16 ] && tflag=--bf16
	timeout 180 $PY "$here/test/gpu/torch_gpt2_bench.py" -L $TL -C 768 --heads 12 -T 1024 -B 8 \
		--compile-scope blocks $tflag \
		--iters $IT --warmup 3 >"$out/big_torch$sfx.json" 2>"$out/big_torch$sfx.err"
	tr=$( ($PY - "$out" "$sfx" <<'EOF'
import json, sys, statistics
out, sfx = sys.argv[1], sys.argv[2]
steps = [json.loads(l)["tokens_per_s"] for l in open(f"{out}/big{sfx}.jsonl") if '"event":"train"' in l]
ours = statistics.median(steps[2:] if len(steps) > 3 else steps)
t = json.load(open(f"{out}/big_torch{sfx}.json"))
runs = [(r["mode"] + "/" + r.get("attention", "?"), r.get("tok_per_s")) for r in t["runs"]]
parts = ", ".join(f"{m} {v:.0f} ({ours / v:.2f}x)" for m, v in runs if v)
manual = [v for m, v in runs if m == "eager/manual" and v]
best = max([v for m, v in runs if v] or [0])
ok = ours >= best if sfx in ("", "-bf16") else manual and ours >= manual[0]
bar = "torch's best" if sfx in ("", "-bf16") else "torch eager/manual"
print(("PASS" if ok else "FAIL"), f"ours {ours:.0f} tok/s (target: {bar}); torch: {parts}")
EOF
	) 2>&1 | verdict big$sfx)
	row "training $prec" "${tr%% *}" "${tr#* }"
done

stamp "training throughput, fused attention"
CORE_CUDA_ATTENTION=fused timeout 300 "$B/dpc-train-path" --device cuda -f -c "$here/configs/gpt-tiny.yaml" \
	-s model.n_layer=12 -s model.n_embd=768 -s model.n_head=12 -s model.seq_len=1024 \
	-s train.batch_size=8 -s train.steps=$IT -s train.eval_every=0 -s train.checkpoint_every=0 $TR \
	-d "$pack/data/val.tok" -o "$out/big-fused.safetensors" -m "$out/big-fused.jsonl" -q \
	>"$out/big-fused.json" 2>"$out/big-fused.err"
at=$($PY -c 'import json,statistics,sys
def f(n):
    v = [json.loads(l)["tokens_per_s"] for l in open(f"{sys.argv[1]}/{n}.jsonl") if "\"event\":\"train\"" in l]
    return statistics.median(v[2:] if len(v) > 3 else v)
c,u=f("big"),f("big-fused"); print(f"INFO cublas {c:.0f} tok/s, fused {u:.0f} tok/s ({u/c:.2f}x)")' "$out" 2>&1 | verdict big-fused)
row "attention" "${at%% *}" "${at#* }"

stamp "done"
echo
echo "gpu-check summary ($(cat "$out/gpu.txt"))"
cat "$summary"
grep -q FAIL "$summary" && exit 1
exit 0
