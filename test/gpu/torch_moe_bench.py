#!/usr/bin/env python3
"""torch_moe_bench.py - our Mixture-of-Experts layer (lib/moe/moe.h) written in plain PyTorch
the way a PyTorch user writes a Tutel-like layer without Tutel's kernels, timed forward and
forward + backward for comparison with moe-bench on the same GPU (test/gpu, not shipped).

The layer, T tokens x [T, M], E experts of hidden size H, top-k, as moe.h / moe-bench(1) with
their defaults (no gate noise, no BPR, GShard loss, capacity align 1):
  gate      logits = x wg (wg [M, E], no bias); p = softmax(logits) in float32; top-k of p
            (torch.topk, descending); scores = the chosen p (k = 1) or the chosen p
            renormalised to sum 1 (k > 1, denominator clamped at FLT_EPSILON)
  aux loss  GShard: E * sum_e mean_t(onehot(first choice)) * mean_t(p)
  capacity  C = k * int(x * ceil(T / E)) for a setting x > 0 (Tutel); x == 0: the largest
            expert count; x < 0: that, capped at k * int(|x| * ceil(T / E)) (these two read the
            counts on the host, as our layer does); then rounded up to --capacity-align
  slots     rank-major, token order: loc = cumsum over the [k*T, E] one-hot choices - 1 (every
            first choice before any second one); a choice with loc >= C is dropped
  dispatch  disp[E*C, M] = zeros, index_copy of the kept tokens to row e*C + loc (dropped ones
            go to a spare row that is cut off)
  experts   torch.baddbmm: h = act(disp w1 + b1) (w1 [E, M, H], relu or tanh-GELU),
            eo = h w2 + b2 (w2 [E, H, M]), over all E*C slots (padding rows included)
  combine   y = sum over the token's k choices of score * eo[slot] (index_select; dropped
            choices weigh 0)
Backward: autograd of y against a fixed random dy plus 0.01 * aux (moe-bench's weight), into
x (unless --no-input-grad) and all parameters. Inputs, dy and parameters are drawn as moe-bench
draws them (other random numbers): x, dy ~ N(0, 1); wg, w1 ~ N(0, 1/sqrt(M)), w2 ~ N(0,
1/sqrt(H)); biases ~ N(0, 0.1).

Timing as moe-bench: per step, synchronise, forward, synchronise, backward, synchronise
(wall clock); the median over --iterations steps after --warmup steps. Runs: eager and
torch.compile of the layer function (compile time excluded, reported as compile_s). A run that
fails reports its error string. Before timing (unless --no-check) the layer on the device is
checked against a dense GShard formulation (one-hot masks, combine [T,E,C], einsums) in float64
on the CPU at small sizes: outputs, aux loss and every gradient.

stdout: one JSON object on one line. stderr: progress.
Exit status: 0 ok, 1 the correctness check failed, 2 usage error.
"""
import argparse
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

PROG = "torch_moe_bench.py"
FLT_EPSILON = 1.1920928955078125e-07
AUX_WEIGHT = 0.01
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def finite(v):
    """JSON without NaN/Infinity tokens: non-finite floats become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def err_str(e):
    s = f"{type(e).__name__}: {e}".strip()
    return s if len(s) <= 2000 else s[:2000] + " ..."


def set_fp32_precision(tf32):
    """As torch_gpt2_bench.py: the fp32_precision API where torch has it (mixing it with the
    legacy flags can raise RuntimeError), else the legacy allow_tf32 flags."""
    mode = "tf32" if tf32 else "ieee"
    b = torch.backends
    if hasattr(b, "fp32_precision") and hasattr(b.cuda.matmul, "fp32_precision"):
        out = {"api": "fp32_precision"}
        for name, obj in (("backends", b), ("cuda.matmul", b.cuda.matmul), ("cudnn", b.cudnn),
                          ("cudnn.conv", getattr(b.cudnn, "conv", None)),
                          ("cudnn.rnn", getattr(b.cudnn, "rnn", None))):
            if obj is None or not hasattr(obj, "fp32_precision"):
                continue
            try:
                obj.fp32_precision = mode
                out[name] = obj.fp32_precision
            except Exception as e:
                out[name] = f"not set ({err_str(e)})"
        return out
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return {"api": "allow_tf32", "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


# ---- capacity (moe.h step 4) ----------------------------------------------------------------
def capacity_fixed(E, T, k, x):
    """Tutel's k * int(x * ceil(T / E)): ceil in integers, the product in double, truncated."""
    return k * int(x * ((T + E - 1) // E))


def capacity(need, E, T, k, setting, align):
    """need = the largest expert count (only read for setting <= 0)."""
    if setting == 0:
        C = int(need)
    else:
        C = capacity_fixed(E, T, k, abs(setting))
        if setting < 0:
            C = min(C, int(need))
    if align > 1 and C % align:
        C += align - C % align
    return C


def act_fn(name):
    if name == "relu":
        return F.relu
    return lambda z: F.gelu(z, approximate="tanh")


# ---- the layer, sparse (index-based), as a PyTorch user writes it ---------------------------
def gate(x, wg, k):
    """p [T,E] float32 (float64 for float64 x), top-k experts [T,k], scores [T,k] as p, and
    the GShard aux loss."""
    E = wg.shape[1]
    p = (x @ wg).to(torch.promote_types(x.dtype, torch.float32)).softmax(dim=-1)
    topv, topi = p.topk(k, dim=-1)
    score = topv if k == 1 else topv / topv.sum(dim=-1, keepdim=True).clamp_min(FLT_EPSILON)
    mask1 = F.one_hot(topi[:, 0], E).to(p.dtype)
    aux = E * (mask1.mean(dim=0) * p.mean(dim=0)).sum()
    return p, topi, score, aux


def moe_sparse(x, wg, w1, b1, w2, b2, k, setting, align, act, C_fixed=None):
    """y [T,M], aux loss, C, kept (token, expert) choices (a 0-d tensor)."""
    T, M = x.shape
    E = wg.shape[1]
    p, topi, score, aux = gate(x, wg, k)
    e_rm = topi.t().reshape(-1)                       # [k*T] rank-major: r*T + t
    onehot = F.one_hot(e_rm, E)                       # [k*T, E]
    loc = onehot.cumsum(dim=0).gather(1, e_rm.unsqueeze(1)).squeeze(1) - 1
    if C_fixed is not None:
        C = C_fixed
    else:  # the counts decide C: read on the host, as our layer reads them
        C = capacity(int(onehot.sum(dim=0).max()), E, T, k, setting, align)
    kept = loc < C
    slot = torch.where(kept, e_rm * C + loc, torch.full_like(loc, E * C))  # E*C: spare row
    disp = x.new_zeros(E * C + 1, M).index_copy(0, slot, x.repeat(k, 1))[:E * C]
    h = act(torch.baddbmm(b1.unsqueeze(1), disp.view(E, C, M), w1))
    eo = torch.baddbmm(b2.unsqueeze(1), h, w2).view(E * C, M)
    w = score.t().reshape(-1) * kept                  # dropped choices weigh 0
    g = eo.index_select(0, torch.where(kept, slot, torch.zeros_like(slot)))
    y = (g * w.to(g.dtype).unsqueeze(1)).view(k, T, M).sum(dim=0)
    return y, aux, C, kept.sum()


# ---- the dense GShard formulation (the check's oracle, as moe_dense.c) ----------------------
def moe_dense(x, wg, w1, b1, w2, b2, k, setting, align, act):
    T, M = x.shape
    E = wg.shape[1]
    p, topi, score, aux = gate(x, wg, k)
    masks = [F.one_hot(topi[:, r], E) for r in range(k)]     # [T,E] per rank
    counts = sum(m.sum(dim=0) for m in masks)
    C = capacity(int(counts.max()), E, T, k, setting, align)
    combine = x.new_zeros(T, E, C)
    dmask = x.new_zeros(T, E, C)
    base = torch.zeros(E, dtype=torch.long)
    for r in range(k):
        loc = masks[r].cumsum(dim=0) - 1 + base               # [T,E]
        base = base + masks[r].sum(dim=0)
        keep = (masks[r] > 0) & (loc < C)
        oh = F.one_hot(loc.clamp(0, C - 1), C).to(x.dtype) * keep.unsqueeze(-1).to(x.dtype)
        combine = combine + score[:, r].to(x.dtype).view(T, 1, 1) * oh
        dmask = dmask + oh
    disp = torch.einsum("tec,tm->ecm", dmask, x)
    h = act(torch.einsum("ecm,emh->ech", disp, w1) + b1.unsqueeze(1))
    eo = torch.einsum("ech,ehm->ecm", h, w2) + b2.unsqueeze(1)
    y = torch.einsum("tec,ecm->tm", combine, eo)
    return y, aux, C, dmask.sum()


# ---- data -----------------------------------------------------------------------------------
def make_data(T, M, H, E, seed, dtype, dev):
    g = torch.Generator().manual_seed(seed)

    def n(shape, std):
        return (std * torch.randn(shape, generator=g, dtype=torch.float32)).to(dev, dtype)

    params = {"wg": n((M, E), 1 / math.sqrt(M)), "w1": n((E, M, H), 1 / math.sqrt(M)),
              "b1": n((E, H), 0.1), "w2": n((E, H, M), 1 / math.sqrt(H)), "b2": n((E, M), 0.1)}
    return n((T, M), 1.0), n((T, M), 1.0), params


NAMES = ("wg", "w1", "b1", "w2", "b2")


def run_layer(fn, x, P, dy, backward):
    y, aux, C, kept = fn(x, *[P[n] for n in NAMES])
    if backward:
        torch.autograd.backward([y, aux], [dy, torch.tensor(AUX_WEIGHT, dtype=aux.dtype,
                                                            device=aux.device)])
    return y, aux, C, kept


def check(dev, k_main, setting_main, align, act_name, seed):
    """The sparse layer (float32 on dev) against the dense formulation (float64, CPU)."""
    act = act_fn(act_name)
    T, M, H, E = 37, 8, 16, 4
    results, ok, dropped_seen = [], True, False
    for k in sorted({1, min(k_main, E)}):
        for setting in sorted({setting_main, 0.5, 0.0, -0.75}):
            x, dy, P = make_data(T, M, H, E, seed + 7, torch.float64, torch.device("cpu"))
            xd = x.detach().clone().requires_grad_(True)
            Pd = {n: v.detach().clone().requires_grad_(True) for n, v in P.items()}
            yd, auxd, Cd, keptd = run_layer(
                lambda *a: moe_dense(*a, k=k, setting=setting, align=align, act=act),
                xd, Pd, dy, True)
            xs = x.detach().to(dev, torch.float32).requires_grad_(True)
            Ps = {n: v.detach().to(dev, torch.float32).requires_grad_(True) for n, v in P.items()}
            ys, auxs, Cs, kepts = run_layer(
                lambda *a: moe_sparse(*a, k=k, setting=setting, align=align, act=act),
                xs, Ps, dy.to(dev, torch.float32), True)

            def rel(a, b):
                a, b = a.detach().cpu().double(), b.detach().cpu().double()
                return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
            errs = {"y": rel(ys, yd), "aux": rel(auxs, auxd), "dx": rel(xs.grad, xd.grad)}
            errs.update({f"d{n}": rel(Ps[n].grad, Pd[n].grad) for n in NAMES})
            worst = max(errs.values())
            good = Cs == Cd and int(kepts) == int(keptd) and worst <= 1e-4
            dropped_seen |= int(keptd) < k * T
            ok &= good
            results.append({"k": k, "capacity": setting, "C": Cs, "C_dense": Cd,
                            "kept": int(kepts), "kept_dense": int(keptd),
                            "max_rel_err": worst, "ok": good})
    if not dropped_seen:
        ok = False
    return {"ok": ok, "T": T, "M": M, "H": H, "E": E, "cases": results,
            "dropping_exercised": dropped_seen}


# ---- timing ---------------------------------------------------------------------------------
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def cleanup(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def bench_run(args, dev, mode, x0, dy, P0, C_fixed):
    run = {"mode": mode}
    act = act_fn(args.activation)
    backward = not args.forward_only
    fn = None
    try:
        x = x0.detach().clone().requires_grad_(args.input_grad and backward)
        P = {n: v.detach().clone().requires_grad_(backward) for n, v in P0.items()}

        def layer(x, wg, w1, b1, w2, b2):
            return moe_sparse(x, wg, w1, b1, w2, b2, k=args.top_k, setting=args.capacity,
                              align=args.capacity_align, act=act, C_fixed=C_fixed)
        fn = layer
        if mode == "compile":
            if not hasattr(torch, "compile"):
                raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
            fn = torch.compile(layer, **({"mode": args.compile_mode} if args.compile_mode
                                         else {}))
        gaux = torch.tensor(AUX_WEIGHT, dtype=torch.float32, device=dev)  # d loss / d aux
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        fwd, bwd, step, warm = [], [], [], []
        for i in range(args.warmup + args.iters):
            x.grad = None
            for v in P.values():
                v.grad = None
            sync(dev)
            t0 = time.perf_counter()
            y, aux, C, kept = fn(x, *[P[n] for n in NAMES])
            sync(dev)
            t1 = time.perf_counter()
            if backward:
                torch.autograd.backward([y, aux], [dy, gaux])
            sync(dev)
            t2 = time.perf_counter()
            if i < args.warmup:
                warm.append(t2 - t0)
                log(f"  {mode} warmup {i + 1}/{args.warmup}: {(t2 - t0) * 1e3:.2f} ms")
                continue
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            step.append(t2 - t0)
        med = statistics.median
        R = int(kept)
        run.update({"fwd_ms": med(fwd) * 1e3, "step_ms": med(step) * 1e3,
                    "step_ms_min": min(step) * 1e3, "step_ms_max": max(step) * 1e3,
                    "iters": len(step), "warmup": args.warmup, "C": int(C), "kept_rows": R,
                    "aux_loss": float(aux)})
        if backward:
            run["bwd_ms"] = med(bwd) * 1e3
        # moe_step_flops: gate 2TME + experts 4RMH forward; backward twice that, less 2RMH +
        # 2TME without the input gradient. "executed": the GEMMs over all E*C slots.
        T, M, H, E = args.tokens, args.model_dim, args.hidden_dim, args.experts

        def flops(rows):
            f = 2 * T * M * E + 4 * rows * M * H
            if backward:
                f += 2 * f - (0 if args.input_grad else 2 * rows * M * H + 2 * T * M * E)
            return f
        run["useful_tflops"] = flops(R) / med(step) / 1e12
        run["executed_tflops"] = flops(E * int(C)) / med(step) / 1e12
        if warm:
            run["first_step_s"] = warm[0]
            if mode == "compile":
                run["compile_s"] = max(warm[0] - med(step), 0.0)
        if dev.type == "cuda":
            run["peak_mem_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        log(f"{mode}: fwd {run['fwd_ms']:.3f} ms, fwd+bwd {run['step_ms']:.3f} ms (median of "
            f"{len(step)}), {run['useful_tflops']:.2f} useful TFLOP/s")
    except Exception as e:
        run["error"] = err_str(e)
        log(f"{mode} failed: {run['error']}")
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
    finally:
        fn = x = P = None  # noqa: F841 (free them before the next run)
        if mode == "compile":
            try:
                torch._dynamo.reset()
            except Exception:
                pass
        cleanup(dev)
    return run


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-T", "--tokens", type=int, default=4096, help="tokens T (default 4096)")
    p.add_argument("-M", "--model-dim", type=int, default=1024, help="M (default 1024)")
    p.add_argument("-H", "--hidden-dim", type=int, default=4096, help="H (default 4096)")
    p.add_argument("-E", "--experts", type=int, default=16, help="E (default 16)")
    p.add_argument("-k", "--top-k", type=int, default=2, help="k (default 2)")
    p.add_argument("-c", "--capacity", type=float, default=1.0,
                   help="capacity setting as moe-bench (default 1.0)")
    p.add_argument("--capacity-align", type=int, default=1)
    p.add_argument("--activation", choices=["relu", "gelu"], default="relu")
    p.add_argument("--iters", "-n", "--iterations", type=int, default=10,
                   help="timed steps (default 10)")
    p.add_argument("--warmup", "-w", type=int, default=2, help="untimed steps (default 2)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32",
                   help="x and parameters (default float32; the gate softmax is float32)")
    p.add_argument("--seed", "-s", type=int, default=1)
    p.add_argument("--modes", default="eager,compile",
                   help="comma-separated subset of eager,compile (default both)")
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--no-input-grad", dest="input_grad", action="store_false",
                   help="backward without dx (as moe-bench --no-input-grad)")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--tf32", action="store_true", help="allow TF32 (default: off)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the check against the dense formulation")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    if min(a.tokens, a.model_dim, a.hidden_dim, a.experts, a.top_k, a.iters,
           a.capacity_align) < 1 or a.warmup < 0 or a.top_k > a.experts:
        p.error("sizes must be >= 1, k <= E and warmup >= 0")
    if a.capacity > 0 and capacity(0, a.experts, a.tokens, a.top_k, a.capacity,
                                   a.capacity_align) == 0:
        p.error(f"--capacity {a.capacity} leaves C = 0 at T={a.tokens}, E={a.experts}")
    a.mode_list = [m for m in a.modes.split(",") if m]
    if not a.mode_list or any(m not in ("eager", "compile") for m in a.mode_list):
        p.error("--modes: a comma-separated subset of eager,compile")
    return a


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        dev = torch.device(args.device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available")
    except Exception as e:
        print(f"{PROG}: --device {args.device}: {err_str(e)}", file=sys.stderr)
        return 2
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    precision = set_fp32_precision(args.tf32)
    T, M, H, E, k = args.tokens, args.model_dim, args.hidden_dim, args.experts, args.top_k
    C_fixed = capacity(0, E, T, k, args.capacity, args.capacity_align) \
        if args.capacity > 0 else None
    out = {"bench": "torch_moe", "T": T, "M": M, "H": H, "E": E, "k": k, "C": C_fixed,
           "capacity_setting": args.capacity, "capacity_align": args.capacity_align,
           "activation": args.activation, "dtype": args.dtype, "tf32": bool(args.tf32),
           "precision": precision, "input_grad": bool(args.input_grad),
           "backward": not args.forward_only, "aux_weight": AUX_WEIGHT,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
           else platform.processor() or platform.machine(),
           "python": platform.python_version(), "threads": torch.get_num_threads(),
           "iters": args.iters, "warmup": args.warmup}
    log(f"MoE T={T} M={M} H={H} E={E} k={k} capacity {args.capacity} (C={C_fixed}) "
        f"{args.activation} {args.dtype} on {out['device']} (torch {torch.__version__}, "
        f"TF32 {'on' if args.tf32 else 'off'})")

    check_ok = True
    if args.check:
        try:
            r = check(dev, k, args.capacity, args.capacity_align, args.activation, args.seed)
        except Exception as e:
            r = {"ok": None, "error": err_str(e)}
        out["check"] = r
        check_ok = r.get("ok") is not False
        log(f"check against the dense formulation (float64, CPU): "
            f"{'ok' if r.get('ok') else r.get('error') or 'FAILED'}; "
            + ", ".join(f"k={c['k']} x={c['capacity']} C={c['C']} kept={c['kept']} "
                        f"err={c['max_rel_err']:.1e}" for c in r.get("cases", [])))
        cleanup(dev)

    x, dy, P = make_data(T, M, H, E, args.seed, DTYPES[args.dtype], dev)
    runs = []
    for mode in args.mode_list:
        log(f"run {mode}: {args.warmup} warmup + {args.iters} timed steps")
        runs.append(bench_run(args, dev, mode, x, dy, P, C_fixed))
    out["runs"] = runs
    ok_runs = [r for r in runs if "kept_rows" in r]
    if ok_runs:
        out["C"] = ok_runs[0]["C"]
        out["kept_rows"] = ok_runs[0]["kept_rows"]
        out["dropped"] = k * T - ok_runs[0]["kept_rows"]
    out["check_ok"] = check_ok
    print(json.dumps(finite(out), separators=(",", ":")), flush=True)
    return 0 if check_ok else 1


if __name__ == "__main__":
    sys.exit(main())
