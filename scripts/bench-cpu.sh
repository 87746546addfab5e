#!/bin/sh
# bench-cpu.sh - does training run at this processor's speed? One table, one run.
#
#   scripts/bench-cpu.sh [-n STEPS] [-r REPS] [--no-torch] [TOKENS]
#                                        (default 30 steps, 2 repetitions, data/brown/train.tok)
#
# For 1 and 2 threads, dpc-train-path on configs/gpt-tiny.yaml (B=8, T=256) for STEPS steps in
# each setting, the settings interleaved REPS times (each figure the median over repetitions
# of the median per-step tokens/s after 3 warm-up steps):
#   default           no variable set: what a fresh machine runs (the library and kernel the
#                     cpu backend chooses, lib/backend/cpu/cpu_blas.h)
#   openblas          CORE_CPU_BLAS=openblas: OpenBLAS with the core corrected by cpuid
#   openblas:CORE     OpenBLAS with OPENBLAS_CORETYPE=CORE forced, for CORE in the one OpenBLAS
#                     picks by itself here ("as installed", the build's former kernel), and
#                     Prescott, Haswell, SkylakeX (those this CPU can run)
#   bf16              --precision bf16 (where the CPU and oneDNN have it)
# and for each: the kernel (gemm_kernel of the JSON), the step's matmul share (matmul_frac),
# and the effective GFLOP/s of the step's products (their flops, from the config, over the
# time inside them). The same fp32 settings, interleaved with those, for moe-bench's default
# layer (T=4096 M=1024 H=4096 E=16 k=2, forward and backward, -n 10 after 2 warm-up steps):
# its median step time and the forward expert GEMMs' GFLOP/s. Then PyTorch eager
# (scripts/bench-train-torch.py), with
# torch.set_flush_denormal(True), in its best of: default / passive / one intra-op thread,
# each with OpenBLAS as installed and with OPENBLAS_CORETYPE=SkylakeX (its best kernel here),
# in fp32 and under bfloat16 autocast. Ends with the verdicts: default against the best
# setting (the target is 95%), bf16 against fp32, ours against PyTorch.
# Programs come from $BIN (default build/bin). About 12 minutes on 2 cores.
set -eu

usage() { echo "usage: $0 [-n STEPS] [-r REPS] [--no-torch] [TOKENS]"; }
steps=30 reps=2 torch=1
while [ $# -gt 0 ]; do
	case $1 in
	-n) steps=${2:?}; shift 2 ;;
	-r) reps=${2:?}; shift 2 ;;
	--no-torch) torch=0; shift ;;
	-h | --help) usage; exit 0 ;;
	-*) usage >&2; exit 2 ;;
	*) break ;;
	esac
done
[ $# -le 1 ] || { usage >&2; exit 2; }
case $steps$reps in *[!0-9]*) echo "$0: -n and -r take whole numbers" >&2; exit 2 ;; esac
[ "$steps" -ge 8 ] || { echo "$0: -n $steps: need at least 8 steps" >&2; exit 2; }
[ "$reps" -ge 1 ] || { echo "$0: -r $reps: need at least 1 repetition" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BIN=${BIN:-$root/build/bin}
PY=/usr/bin/python3
CFG=configs/gpt-tiny.yaml
tok=${1:-data/brown/train.tok}
[ -x "$BIN/dpc-train-path" ] || { echo "$0: '$BIN/dpc-train-path': not built (run make)" >&2; exit 1; }
[ -f "$tok" ] || { echo "$0: '$tok': no such file (scripts/quickstart.sh prepares data/brown)" >&2; exit 1; }
if [ $torch = 1 ] && ! "$PY" -c 'import torch' 2>/dev/null; then
	echo "$0: '$PY' cannot import torch: PyTorch rows left out (install python3-torch)" >&2
	torch=0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-cpu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# The machine, and the core OpenBLAS picks by itself here (loaded as a fresh program would).
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
fam=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mod=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
isa=""
for f in avx2 avx512f avx512_bf16 amx_bf16; do has $f && isa="$isa $f"; done
own=$(env -u OPENBLAS_CORETYPE "$PY" -c '
import ctypes, os
d = "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0"
lib = ctypes.CDLL(d if os.path.exists(d) else "libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' 2>/dev/null || echo unknown)

cores="$own Prescott"
has avx2 && cores="$cores Haswell"
has avx512f && cores="$cores SkylakeX"
cores=$(echo "$cores" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')
settings="default openblas"
for c in $cores; do settings="$settings openblas:$c"; done
if has avx512_bf16; then settings="$settings bf16"; fi

# run SETTING THREADS REP: one dpc-train-path run; its JSON and metrics under $tmp
run() {
	set -- "$1" "$2" "$3" "$tmp/$(echo "$1" | tr ':' '_')-$2-$3"
	prec=fp32
	case $1 in
	default) envs="" ;;
	openblas) envs="CORE_CPU_BLAS=openblas" ;;
	openblas:*) envs="CORE_CPU_BLAS=openblas OPENBLAS_CORETYPE=${1#openblas:}" ;;
	bf16) envs="" prec=bf16 ;;
	esac
	# shellcheck disable=SC2086
	env -u OPENBLAS_CORETYPE -u CORE_CPU_BLAS -u OPENBLAS_L2_SIZE $envs OMP_NUM_THREADS=$2 \
		"$BIN/dpc-train-path" -c "$CFG" -d "$tok" -o "$4.safetensors" -m "$4.jsonl" \
		-u "$steps" -t "$2" -q --force --precision $prec >"$4.json" ||
		{ echo "$0: dpc-train-path ($1, $2 threads) failed" >&2; exit 1; }
	rm -f "$4.safetensors"
}

# runmoe SETTING THREADS REP: one moe-bench run of the default layer (fp32 settings only)
runmoe() {
	f="$tmp/moe-$(echo "$1" | tr ':' '_')-$2-$3.json"
	case $1 in
	default) envs="" ;;
	openblas) envs="CORE_CPU_BLAS=openblas" ;;
	openblas:*) envs="CORE_CPU_BLAS=openblas OPENBLAS_CORETYPE=${1#openblas:}" ;;
	*) return 0 ;;
	esac
	# shellcheck disable=SC2086
	env -u OPENBLAS_CORETYPE -u CORE_CPU_BLAS -u OPENBLAS_L2_SIZE $envs OMP_NUM_THREADS=$2 \
		"$BIN/moe-bench" -n 10 -w 2 >"$f" 2>/dev/null ||
		{ echo "$0: moe-bench ($1, $2 threads) failed" >&2; exit 1; }
}

for t in 1 2; do
	r=1
	while [ $r -le "$reps" ]; do
		echo "==> $t thread(s), repetition $r of $reps: $settings ($(date +%T))" >&2
		for s in $settings; do run "$s" $t $r; runmoe "$s" $t $r; done
		r=$((r + 1))
	done
done

torchjson=""
if [ $torch = 1 ]; then
	for t in 1 2; do
		for prec in fp32 bf16; do
			for st in default passive blas; do
				[ $t = 1 ] && [ $st != default ] && continue
				for core in installed SkylakeX; do
					intra=$t omp=$t blas=$t wait=""
					[ $st = blas ] && intra=1 omp=1
					[ $st = passive ] && wait=PASSIVE
					f="$tmp/torch-$t-$prec-$st-$core.json"
					echo "==> PyTorch $prec, $t thread(s), $st, OpenBLAS $core ($(date +%T))" >&2
					env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY -u OPENBLAS_L2_SIZE \
						${wait:+OMP_WAIT_POLICY=$wait} \
						$( [ $core = SkylakeX ] && echo OPENBLAS_CORETYPE=SkylakeX ) \
						OMP_NUM_THREADS=$omp OPENBLAS_NUM_THREADS=$blas \
						"$PY" scripts/bench-train-torch.py one -c "$CFG" -d "$tok" \
						-n "$steps" --intra $intra $( [ $prec = bf16 ] && echo --bf16 ) \
						>"$f" || { echo "$0: PyTorch run failed" >&2; exit 1; }
					torchjson="$torchjson $t:$prec:$st:$core=$f"
				done
			done
		done
	done
fi

echo "CPU: $cpu (family $fam, model $mod;$isa); OpenBLAS picks '$own' by itself"
"$PY" - "$tmp" "$CFG" "$reps" "$settings" $torchjson <<'EOF'
import glob, json, os, statistics, sys
tmp, cfgpath, reps, settings = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
torch = [a.split("=", 1) for a in sys.argv[5:]]
sys.path.insert(0, "test/ref")
import gpt2_torch as ref
cfg, model = ref.load_config(cfgpath, [])
L, C, T, V = (int(model[k]) for k in ("n_layer", "n_embd", "seq_len", "vocab_size"))
N = cfg["batch_size"] * T
# the step's products: 3 per weight (forward, input and weight gradients) of 2 N w flops;
# attention's 6 products of 2 T^2 hs per (batch, head), of which the CPU backend computes
# the (nb + 1) / (2 nb) under the diagonal in blocks of 32 keys (ATT_BLOCK)
weights = L * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + V * C
nb = max(1, T // 32)
flops = 6.0 * N * weights + L * cfg["batch_size"] * 12.0 * T * T * C * (nb + 1) / (2 * nb)

def ours(s, t):
    tps, frac, kern = [], [], None
    for r in range(1, reps + 1):
        base = os.path.join(tmp, f"{s.replace(':', '_')}-{t}-{r}")
        with open(base + ".json") as f:
            j = json.loads(f.read().strip().splitlines()[-1])
        ev = [json.loads(x) for x in open(base + ".jsonl") if x.strip()]
        tps.append(statistics.median([e["tokens_per_s"] for e in ev
                                      if e.get("event") == "train"][3:]))
        frac.append(j["matmul_frac"])
        kern = j["gemm_kernel"] + (" bf16" if j["precision"] == "bf16" else "")
    return statistics.median(tps), statistics.median(frac), kern

print(f"gpt-tiny (L={L} C={C} T={T} V={V} B={cfg['batch_size']}): {flops / 1e9:.1f} GFLOP of "
      f"products per step; tok/s: median of {reps} repetition(s) of the median per-step "
      f"tokens/s after 3 warm-up steps")
print(f"{'threads':>7} {'setting':<22} {'kernel':<36} {'tok/s':>8} {'x default':>9} "
      f"{'matmul':>6} {'GFLOP/s':>8}")
verdicts = []
best_ours = {}
for t in (1, 2):
    res = {s: ours(s, t) for s in settings}
    d = res["default"][0]
    for s in settings:
        tps, frac, kern = res[s]
        gf = flops / (N / tps) / frac / 1e9 if frac > 0 else float("nan")
        print(f"{t:>7} {s:<22} {kern:<36} {tps:>8.0f} {tps / d:>9.2f} {frac:>6.3f} {gf:>8.0f}")
    fp = {s: v for s, v in res.items() if s != "bf16"}
    best = max(fp, key=lambda s: fp[s][0])
    best_ours[t] = (d, res.get("bf16", (None,))[0])
    verdicts.append(f"{t} thread(s): default {d:.0f} tok/s = {d / fp[best][0]:.3f} of the best "
                    f"fp32 setting ({best}, {fp[best][0]:.0f}); target >= 0.95: "
                    f"{'held' if d >= 0.95 * fp[best][0] else 'NOT held'}")
    if "bf16" in res:
        b = res["bf16"][0]
        amx = "amx_bf16" in open("/proc/cpuinfo").read().split()
        verdict = ("held" if b >= 2 * d else "NOT held") if amx else "this CPU has no AMX: not tested"
        verdicts.append(f"{t} thread(s): bf16 {b:.0f} tok/s = {b / d:.2f}x our fp32 (target "
                        f">= 2x where the CPU has AMX: {verdict})")
# moe-bench's default layer in the same settings (fp32): median over repetitions of the
# median step time
print(f"moe-bench default layer (T=4096 M=1024 H=4096 E=16 k=2, forward + backward): step ms, "
      f"median of {reps} repetition(s) of the median of 10 steps")
print(f"{'threads':>7} {'setting':<22} {'kernel':<36} {'step ms':>8} {'x default':>9} "
      f"{'fwd GF/s':>9}")
for t in (1, 2):
    res = {}
    for s in settings:
        if s == "bf16":
            continue
        ms, gf, kern = [], [], None
        for r in range(1, reps + 1):
            with open(os.path.join(tmp, f"moe-{s.replace(':', '_')}-{t}-{r}.json")) as f:
                j = json.loads(f.read().strip().splitlines()[-1])
            ms.append(j["step_ms"]["median"])
            gf.append(j.get("expert_fwd_gflops", float("nan")))
            kern = j["gemm_kernel"]
        res[s] = (statistics.median(ms), statistics.median(gf), kern)
    d = res["default"][0]
    for s, (ms, gf, kern) in res.items():
        print(f"{t:>7} {s:<22} {kern:<36} {ms:>8.1f} {d / ms:>9.2f} {gf:>9.0f}")
    best = min(res, key=lambda s: res[s][0])
    verdicts.append(f"{t} thread(s): moe-bench default {d:.1f} ms = {res[best][0] / d:.3f} of "
                    f"the best setting's speed ({best}, {res[best][0]:.1f} ms); target >= 0.95: "
                    f"{'held' if res[best][0] >= 0.95 * d else 'NOT held'}")
if torch:
    rows = {}
    for key, path in torch:
        t, prec, st, core = key.split(":")
        with open(path) as f:
            j = json.loads(f.read().strip().splitlines()[-1])
        rows.setdefault((int(t), prec), []).append((j["tokens_per_s"], f"{st}, OpenBLAS {core}"))
    print(f"{'threads':>7} {'PyTorch (flush_denormal)':<22} {'best setting':<36} {'tok/s':>8} "
          f"{'ours/it':>9}")
    for (t, prec), v in sorted(rows.items()):
        tps, how = max(v)
        o = best_ours[t][0 if prec == "fp32" else 1]
        print(f"{t:>7} {prec:<22} {how:<36} {tps:>8.0f} "
              f"{(o / tps if o else float('nan')):>9.2f}")
        if o:
            verdicts.append(f"{t} thread(s) {prec}: ours {o:.0f} tok/s against PyTorch's best "
                            f"{tps:.0f} ({how}): {o / tps:.2f}x")
print("GFLOP/s: the step's product flops over the time spent in products (matmul share x "
      "step time): what the kernel delivers on the model's own shapes")
for v in verdicts:
    print(v)
EOF
