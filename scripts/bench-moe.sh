#!/bin/sh
# bench-moe.sh - moe-bench against its peers, measured in one invocation on this machine.
#
# For each thread count (1 and 2 by default) it runs, one after the other:
#   moe-bench --only=encode-decode   the issue's encode+decode case (T=16384, E=16, k=2,
#                                    M=1024, capacity factor 1.0), next to a plain copy
#   moe-bench                        Tutel's helloworld layer (T=8192, M=H=2048, E=2, k=2,
#                                    factor 1.0), forward + backward
#   scripts/bench-moe-torch.py       the PyTorch peers of both (Tutel-style index_add
#                                    encode/decode, the helloworld step, its expert GEMMs
#                                    alone, a copy of the same bytes)
# and prints one table: ours, PyTorch measured here, Tutel, the ratios, the copy bandwidth,
# the expert-GEMM efficiency against the sgemm rate moe-bench reports, and the non-GEMM time
# against Tutel's.
#
#   sh scripts/bench-moe.sh [--quick] [--threads "1 2"] [--iters N] [--dense]
#                           [--dense-T N] [--tutel DIR] [--out DIR]
#
# --tutel DIR: Tutel itself is measured in the same run, from DIR, a checkout of
# microsoft/tutel (0.3) whose CPU extension tutel_custom_kernel is built there (Tutel is not
# in Debian, and nothing of it is in this repository): its fast_encode/fast_decode on the
# encode+decode case and its moe_layer on the helloworld step (bench-moe-torch.py cases
# tutel-encdec and tutel-layer). Tutel's non-GEMM time is then its step minus PyTorch's
# expert GEMMs of the same shapes, timed in the same run. Without --tutel the Tutel column
# quotes the issue's measurements of Tutel on this machine, and its non-GEMM time is taken
# as ~10% of its step (its expert GEMMs are ~90%).
#
# --quick: small sizes and 2 timed iterations, well under a minute. The full run (3 timed
# iterations after 1 warm-up, medians) takes ~3-4 minutes on the quiet 2-core machine, about
# twice that when other work loads it (the table prints the load average). --dense adds the
# dense GShard formulation, ours and PyTorch's, at --dense-T tokens (default 4096; 16384,
# the issue's size, takes minutes and ~7 GiB per thread count).
# --out DIR keeps the raw JSON Lines there; a stage whose output file is already there and
# complete is not rerun (delete the file, or use a new DIR, to measure again). Programs come
# from $BIN (default build/bin); the Python is /usr/bin/python3 (Debian's torch).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$here/../build/bin}
PY=${PY:-/usr/bin/python3}
threads="1 2"
quick=0
iters=""
dense=0
dense_T=""
out=""
tutel=""

usage() {
	sed -n '/^#   sh /,/^#  *\[--dense-T/p' "$0" | sed 's/^#   sh/usage: sh/; s/^#   /       /'
}
die() {
	code=$1; shift
	echo "bench-moe.sh: $*" >&2
	exit "$code"
}
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 ;;
	--threads) threads=$2; shift ;;
	--threads=*) threads=${1#*=} ;;
	--iters) iters=$2; shift ;;
	--iters=*) iters=${1#*=} ;;
	--dense) dense=1 ;;
	--dense-T) dense=1; dense_T=$2; shift ;;
	--dense-T=*) dense=1; dense_T=${1#*=} ;;
	--out) out=$2; shift ;;
	--out=*) out=${1#*=} ;;
	--tutel) tutel=$2; shift ;;
	--tutel=*) tutel=${1#*=} ;;
	-h|--help) usage; exit 0 ;;
	*) usage >&2; die 2 "unknown option '$1'" ;;
	esac
	shift
done

# Sizes: the issue's, or small ones for --quick (same shapes' ratios, not the same regime).
if [ $quick = 1 ]; then
	ed="-T 2048 -E 16 -k 2 -M 256"
	hw="-T 1024 -M 512 -H 512 -E 2 -k 2"
	pyq="--quick"
	: "${dense_T:=1024}"
	: "${iters:=2}"
	warm=1
else
	ed="-T 16384 -E 16 -k 2 -M 1024"
	hw="-T 8192 -M 2048 -H 2048 -E 2 -k 2"
	pyq=""
	: "${dense_T:=4096}"
	: "${iters:=3}"
	warm=1
fi
case $iters in ''|*[!0-9]*|0) die 2 "--iters wants a positive integer" ;; esac
case $dense_T in ''|*[!0-9]*|0) die 2 "--dense-T wants a positive integer" ;; esac
for t in $threads; do
	case $t in ''|*[!0-9]*|0) die 2 "--threads wants positive integers" ;; esac
done
[ -x "$BIN/moe-bench" ] || die 1 "'$BIN/moe-bench': not built (run make, or set BIN)"
"$PY" -c 'import torch' 2>/dev/null || die 1 "'$PY': cannot import torch"
if [ -n "$tutel" ]; then
	[ -d "$tutel" ] || die 1 "'$tutel': no such directory (--tutel wants a Tutel checkout)"
	tutel=$(cd "$tutel" && pwd)
	export PYTHONPATH="$tutel${PYTHONPATH:+:$PYTHONPATH}"
	"$PY" -c 'import tutel.moe, tutel.impls.fast_dispatch' >/dev/null 2>&1 ||
		die 1 "'$tutel': cannot import tutel from it with $PY (is tutel_custom_kernel built?)"
fi

if [ -z "$out" ]; then
	out=$(mktemp -d "${TMPDIR:-/tmp}/bench-moe.XXXXXX")
fi
mkdir -p "$out"
echo "bench-moe.sh: results in $out" >&2
# Reused results must come from the same sizes: the directory records them.
params="quick=$quick iters=$iters dense=$dense dense_T=$dense_T tutel=$tutel"
if [ -f "$out/params" ]; then
	[ "$(cat "$out/params")" = "$params" ] ||
		die 2 "'$out/params': holds results for '$(cat "$out/params")', not '$params'"
else
	echo "$params" > "$out/params"
fi

# run NAME CMD...: stdout to $out/NAME.jsonl, kept only when the command succeeds; a file
# already there is reused (resumable). Half-written output never stays under the real name.
run() {
	name=$1; shift
	if [ -s "$out/$name.jsonl" ]; then
		echo "bench-moe.sh: reusing $out/$name.jsonl" >&2
		return 0
	fi
	echo "bench-moe.sh: $*" >&2
	"$@" > "$out/$name.jsonl.tmp"
	mv "$out/$name.jsonl.tmp" "$out/$name.jsonl"
}

# moe-bench's OpenMP threads busy-wait between kernels, as they always have in this table
# (moe-bench(1), ENVIRONMENT): a sleeping thread on a virtual machine can take a timer tick
# to wake. The PyTorch peers run with their own defaults, as before.
ours() {
	OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active} "$BIN/moe-bench" "$@"
}

pycases=encdec,layer,expert,copy
[ $dense = 1 ] && pycases=$pycases,dense
[ -n "$tutel" ] && pycases=$pycases,tutel-encdec,tutel-layer
for t in $threads; do
	# shellcheck disable=SC2086
	run "ours-encdec-t$t" ours $ed -c 1.0 --only=encode-decode -t "$t" \
		-n "$iters" -w "$warm"
	# shellcheck disable=SC2086
	run "ours-layer-t$t" ours $hw -c 1.0 --no-input-grad -t "$t" -n "$iters" -w "$warm"
	if [ $dense = 1 ]; then
		# shellcheck disable=SC2086
		run "ours-dense-t$t" ours $ed -H 64 -c 1.0 --forward-only \
			--only=encode-decode --baseline=dense --dense-tokens="$dense_T" \
			-t "$t" -n 1 -w 0
	fi
	# shellcheck disable=SC2086
	run "torch-t$t" "$PY" "$here/bench-moe-torch.py" $pyq --threads "$t" --cases "$pycases" \
		--iters "$iters" --warmup "$warm" --dense-T "$dense_T"
done

# The table. Tutel's figures are measured in this run with --tutel; otherwise they are the
# issue's measurements of Tutel on this machine, quoted as anchors.
# shellcheck disable=SC2086
"$PY" - "$out" "$quick" "$dense_T" "$tutel" $threads <<'EOF'
import json, os, sys

out, quick, dense_T = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
tutel, threads = sys.argv[4], sys.argv[5:]


def load(name):
    p = os.path.join(out, name + ".jsonl")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [json.loads(l) for l in f if l.strip().startswith("{")]


def find(recs, **kw):
    for r in recs:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def first(name, **kw):
    for t in threads:
        r = find(load(name % t), **kw)
        if r:
            return r
    return None


def fmt(x, unit=1.0, nd=1):
    return "-" if x is None else "%.*f" % (nd, x / unit)


def ratio(peer, ours):
    return "-" if peer is None or ours is None or ours <= 0 else "%.2fx" % (peer / ours)


def pct(x, y):
    return "-" if x is None or not y else "%.0f%%" % (100.0 * x / y)


# Tutel anchors in ms, (low, high), by thread count; absent = the issue has none.
A_ED_FWD = {"2": (150.0, 200.0)}
A_ED_FB = {"2": (460.0, 460.0)}
A_DENSE = {"2": (35000.0, 35000.0)}
A_LAYER = {"1": (6700.0, 6700.0), "2": (3500.0, 4500.0)}
TUTEL_GEMM_SHARE = 0.90  # Tutel's expert GEMMs are ~90% of its helloworld step


def tut(tr, case, pas):
    """Tutel measured in this run (--tutel), as a (low, high) pair like the anchors."""
    r = find(tr, case=case, **{"pass": pas})
    return None if r is None else (r["ms_median"], r["ms_median"])


def afmt(a, unit=1.0, nd=0):
    if a is None:
        return "-"
    lo, hi = a
    return fmt(lo, unit, nd) if lo == hi else "%s-%s" % (fmt(lo, unit, nd), fmt(hi, unit, nd))


def aratio(a, ours):
    if a is None or ours is None or ours <= 0:
        return "-"
    lo, hi = a
    return "%.2fx" % (lo / ours) if lo == hi else "%.2f-%.2fx" % (lo / ours, hi / ours)


W = "%-8s %-8s %10s %10s %11s %11s %11s"
print()
if tutel:
    print("moe-bench vs PyTorch vs Tutel, all measured in this run (Tutel from %s)" % tutel)
else:
    print("moe-bench vs PyTorch (measured in this run) vs Tutel (the issue's anchors, same "
          "machine; --tutel DIR measures Tutel itself)")
print("medians; ratios are peer time / our time, above 1 = moe-bench faster; raw JSON in " + out)
if quick and not tutel:
    print("QUICK MODE: small sizes; the Tutel anchors are for the full sizes, so not shown.")
elif quick:
    print("QUICK MODE: small sizes, another regime than the full ones.")
loads = [str(r.get("load1")) for t in threads for r in load("torch-t" + t)
         if r.get("case") == "env"]
if loads:
    print("load average when the PyTorch runs started: %s (%s CPUs; other work on the machine "
          "inflates 2-thread times most)" % (", ".join(loads), os.cpu_count()))

# ---- encode + decode --------------------------------------------------------------------
print()
ed0 = first("ours-encdec-t%s", impl="sparse")
te0 = first("torch-t%s", case="encdec")
if ed0:
    print("== encode+decode (K0+K1; backward K0+K2+K1)  T=%d E=%d k=%d M=%d capacity %s"
          % (ed0["T"], ed0["E"], ed0["k"], ed0["M"], ed0.get("capacity_setting")))
    print("   C ours %s (dropped %s), torch %s (dropped %s): different random gates, same work "
          "to within the drops" % (ed0.get("capacity_last"), ed0.get("dropped_last"),
                                   te0 and te0.get("C"), te0 and te0.get("dropped")))
print(W % ("threads", "pass", "ours ms", "torch ms", "Tutel ms", "torch/ours", "Tutel/ours"))
bw = []
for t in threads:
    o = find(load("ours-encdec-t" + t), impl="sparse")
    tr = load("torch-t" + t)
    tf = find(tr, case="encdec", **{"pass": "fwd"})
    tb = find(tr, case="encdec", **{"pass": "fwdbwd"})
    of = o and o.get("forward_ms")
    ob = o and o["step_ms"]["median"]
    af = tut(tr, "tutel-encdec", "fwd") if tutel else None if quick else A_ED_FWD.get(t)
    ab = tut(tr, "tutel-encdec", "fwdbwd") if tutel else None if quick else A_ED_FB.get(t)
    pf = tf and tf["ms_median"]
    pb = tb and tb["ms_median"]
    nd = 1 if tutel else 0
    print(W % (t, "fwd", fmt(of), fmt(pf), afmt(af, 1.0, nd), ratio(pf, of), aratio(af, of)))
    print(W % (t, "fwd+bwd", fmt(ob), fmt(pb), afmt(ab, 1.0, nd), ratio(pb, ob),
               aratio(ab, ob)))
    cl = find(tr, case="copy", impl="clone")
    cp = find(tr, case="copy", impl="copy_")
    bw.append((t, o and o.get("encdec_gbps"), o and o.get("copy_gbps"),
               o and o.get("time_over_copy"), cp and cp.get("gbps_rw"),
               cl and cl.get("gbps_rw")))
print("   bandwidth, GB/s read + written:")
B = "   %-8s %13s %14s %12s %12s %12s"
print(B % ("threads", "ours enc+dec", "memcpy (ours)", "ours/memcpy", "torch copy_",
           "torch clone"))
for t, e, c, r, p1, p2 in bw:
    print(B % (t, fmt(e), fmt(c), "-" if not r else "%.2f" % (1.0 / r), fmt(p1), fmt(p2)))
print("   (enc+dec: the bytes the kernels must move over their time; torch clone pays fresh "
      "pages\n    on every call, as the torch.zeros of Tutel's encode does)")

# ---- dense --------------------------------------------------------------------------------
rows = []
for t in threads:
    od = find(load("ours-dense-t" + t), impl="dense")
    tdn = find(load("torch-t" + t), case="dense", **{"pass": "fwd"})
    if od or tdn:
        rows.append((t, od, tdn, find(load("ours-dense-t" + t), impl="sparse")))
if rows:
    print()
    print("== dense GShard formulation, forward, T=%d: masks + combine [T,E,C], dispatch "
          "einsum, combine einsum" % dense_T)
    print("   ours: the scan + encode + decode stages of moe-bench's dense run (experts left "
          "out); torch: build + 2 einsums")
    print(W % ("threads", "pass", "ours ms", "torch ms", "Tutel ms", "torch/ours", "Tutel/ours"))
    for t, od, tdn, sp in rows:
        st = od and od["stage_ms"]
        o = st and st["scan"] + st["encode"] + st["decode"]
        p = tdn and tdn["ms_median"]
        a = A_DENSE.get(t) if dense_T == 16384 and not quick else None
        print(W % (t, "fwd", fmt(o), fmt(p), afmt(a), ratio(p, o), aratio(a, o)))
        if o and sp and sp.get("forward_ms"):
            print("   %-8s our sparse encode+decode forward at T=%d: %.1f ms%s" % (
                t, sp["T"], sp["forward_ms"], "; dense/sparse %.1fx" % (o / sp["forward_ms"])
                if sp["T"] == od["T"] else " (dense at T=%d)" % od["T"]))
    if dense_T != 16384:
        print("   (the issue's ~35 s anchor is at T=16384; this run used T=%d)" % dense_T)

# ---- helloworld layer ---------------------------------------------------------------------
print()
l0 = first("ours-layer-t%s", impl="sparse")
tl0 = first("torch-t%s", case="layer")
if l0:
    print("== layer forward+backward (Tutel helloworld)  T=%d M=%d H=%d E=%d k=%d capacity %s"
          % (l0["T"], l0["M"], l0["H"], l0["E"], l0["k"], l0.get("capacity_setting")))
    print("   like Tutel's helloworld, ours runs without the input gradient (--no-input-grad: 5 "
          "expert GEMMs);\n   so does the torch peer%s"
          % (" unless run with --hw-x-grad (6)" if tl0 and tl0.get("x_grad") else ""))
print(W % ("threads", "pass", "ours s", "torch s", "Tutel s", "torch/ours", "Tutel/ours"))
lrows = []
for t in threads:
    o = find(load("ours-layer-t" + t), impl="sparse")
    tr = load("torch-t" + t)
    tl, te, ts = find(tr, case="layer"), find(tr, case="expert"), find(tr, case="sgemm")
    ol = o and o["step_ms"]["median"]
    pl = tl and tl["ms_median"]
    a = tut(tr, "tutel-layer", "fwdbwd") if tutel else None if quick else A_LAYER.get(t)
    print(W % (t, "step", fmt(ol, 1e3, 2), fmt(pl, 1e3, 2), afmt(a, 1e3, 2), ratio(pl, ol),
               aratio(a, ol)))
    lrows.append((t, o, tl, te, ts, a))
print("   expert GEMMs, GFLOP/s; efficiency = rate inside the layer / a plain sgemm of the "
      "expert shape, same run:")
G = "   %-8s %9s %9s %9s %8s %8s | %10s %9s %6s"
print(G % ("threads", "ours fwd", "ours bwd", "sgemm", "eff fwd", "eff bwd", "torch bmm",
           "torch.mm", "eff"))
for t, o, tl, te, ts, a in lrows:
    ef = o and o.get("expert_fwd_gflops")
    eb = o and o.get("expert_bwd_gflops")
    sg = o and o.get("sgemm_gflops")
    pg = te and te.get("gemm_gflops")
    pm = ts and ts.get("gflops")
    print(G % (t, fmt(ef), fmt(eb), fmt(sg), pct(ef, sg), pct(eb, sg), fmt(pg), fmt(pm),
               pct(pg, pm)))
if tutel:
    print("   non-GEMM time per step, s (the step minus its expert GEMMs; for Tutel, its step "
          "minus torch's\n   expert GEMMs of the same shapes, timed in this run):")
else:
    print("   non-GEMM time per step, s (the step minus its expert GEMMs; Tutel: ~%d%% of its "
          "step):" % round(100 * (1 - TUTEL_GEMM_SHARE)))
N = "   %-8s %9s %11s %16s %10s %11s"
print(N % ("threads", "ours", "ours share", "torch", "Tutel", "Tutel/ours"))
for t, o, tl, te, ts, a in lrows:
    on = o and o.get("non_gemm_ms")
    share = None if not o or on is None else on / o["step_ms"]["median"]
    pn = None if not (tl and te) else tl["ms_median"] - te["ms_median"]
    if tutel:
        an = None if a is None or not te else (a[0] - te["ms_median"], a[1] - te["ms_median"])
    else:
        an = None if a is None else (a[0] * (1 - TUTEL_GEMM_SHARE),
                                     a[1] * (1 - TUTEL_GEMM_SHARE))
    print(N % (t, fmt(on, 1e3, 3), "-" if share is None else "%.1f%%" % (100 * share),
               "-" if pn is None else fmt(pn, 1e3, 3) + " (noisy)",
               afmt(an, 1e3, 3 if tutel else 2), aratio(an, on)))
print("   (torch's is the difference of two separately timed runs: noisy, can even be "
      "negative)")
EOF
