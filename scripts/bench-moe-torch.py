#!/usr/bin/python3
"""PyTorch peers for moe-bench, measured on this machine (CPU, fp32).

What moe-bench is compared against, each timed here so that the ratios come from one machine
and one invocation:

  encdec   Tutel-style sparse encode/decode written with torch ops, as Tutel's CPU path does
           it: tokens scattered into [E*C, M] by (expert, location) with index_add_, gathered
           back with index_select and weighted by the gate score (Tutel's default
           is_postscore: encode unweighted, decode weighted). Dropped tokens (location >= C)
           are skipped, like Tutel's kernels K0/K1. Pass "fwd" is decode(encode(x)) without
           autograd; "fwdbwd" adds backward through autograd (K1 for the data gradient, K0
           for the expert-side gradient, K2 = row dot products for the gate gradient).
  dense    the GShard/Fairseq formulation: combine [T,E,C] built from the routing, dispatch
           einsum TEC,TM->ECM and combine einsum TEC,ECM->TM. O(T^2 k M) work: run at the
           issue's T only when asked (--dense-T), it takes tens of seconds and GiBs.
  layer    Tutel's examples/helloworld.py step in plain PyTorch (T = batch 16 x 512 tokens,
           M = H = 2048, E = 2, top-2, capacity factor 1.0): gate linear (no bias), softmax,
           top-k, locations by cumsum, encode, per-expert fc1 + bias, relu, fc2 + bias via
           torch.bmm, decode, log_softmax(sum over M) + nll_loss, backward, SGD step. As in
           helloworld the input does not require grad, so fc1's input gradient is not
           computed (5 expert GEMMs per step, not 6).
  expert   the layer's expert GEMMs alone (same shapes, same autograd graph), so that
           layer - expert = the non-GEMM time of the step.
  copy     x.clone() of the same number of bytes as the encode output [E*C, M] (a fresh
           buffer each time, page faults included, as encode's torch.zeros pays them), then
           dst.copy_(x) into a buffer allocated once (the memcpy ceiling): the memory
           bandwidth figures (GB/s counted as bytes read + bytes written).
  tutel-encdec, tutel-layer
           Tutel itself, when it can be imported (put its checkout, with its CPU extension
           tutel_custom_kernel built, on PYTHONPATH; it is not in Debian): the encdec case
           with Tutel's own extract_critical, fast_encode and fast_decode, and the layer case
           with tutel.moe.moe_layer built as examples/helloworld.py builds it and the same
           step (log_softmax of the sum over M, nll_loss, backward, SGD). Only Tutel's public
           API is called.

One JSON object per measurement on stdout (first an "env" object); progress on stderr.
Times are medians over --iters timed runs after --warmup untimed ones.

Thread counts: OpenBLAS (which Debian's torch uses for matmul) reads its thread count at
load time, so each thread count runs in a child process started with OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS set before torch is imported.

Run with /usr/bin/python3 (Debian's torch 1.13). Example:
  /usr/bin/python3 scripts/bench-moe-torch.py --threads 1,2 --cases encdec,copy --iters 5
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

CASES = ("encdec", "dense", "layer", "expert", "copy", "tutel-encdec", "tutel-layer")


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch peers (Tutel-style encode/decode, GShard einsum, helloworld "
        "layer, copy) for moe-bench; one JSON object per measurement on stdout.")
    p.add_argument("--threads", default="1",
                   help="thread count, or a comma list (each runs in its own process)")
    p.add_argument("--iters", type=int, default=5, help="timed runs per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    p.add_argument("--cases", default="encdec,layer,expert,copy",
                   help="comma list of: " + ",".join(CASES) + " (or 'all': all but tutel-*)")
    p.add_argument("--seed", type=int, default=1)
    # encode/decode (and dense, and copy) sizes: the case
    p.add_argument("-T", "--tokens", type=int, default=16384, help="encdec tokens T")
    p.add_argument("-E", "--experts", type=int, default=16, help="encdec experts E")
    p.add_argument("-k", "--top-k", type=int, default=2, help="encdec top-k")
    p.add_argument("-M", "--model-dim", type=int, default=1024, help="encdec model dim M")
    p.add_argument("-f", "--factor", type=float, default=1.0,
                   help="capacity factor: x>0 fixed, 0 no-drop minimum, -x adaptive capped at x")
    p.add_argument("--dense-T", type=int, default=4096,
                   help="tokens for the dense einsum (O(T^2); 16384 is the issue's size)")
    p.add_argument("--dense-bwd", action="store_true",
                   help="also time the dense formulation's forward+backward")
    # helloworld layer sizes
    p.add_argument("--hw-T", type=int, default=8192, help="layer tokens (16 x 512)")
    p.add_argument("--hw-M", type=int, default=2048, help="layer model dim")
    p.add_argument("--hw-H", type=int, default=2048, help="layer expert hidden dim")
    p.add_argument("--hw-E", type=int, default=2, help="layer experts")
    p.add_argument("--hw-k", type=int, default=2, help="layer top-k")
    p.add_argument("--hw-f", type=float, default=1.0, help="layer capacity factor")
    p.add_argument("--hw-x-grad", action="store_true",
                   help="input requires grad (6 expert GEMMs per step instead of 5)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (T=2048, M=256; layer T=1024, M=H=512), 3 iters")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.tokens, a.model_dim, a.dense_T = 2048, 256, 1024
        a.hw_T, a.hw_M, a.hw_H = 1024, 512, 512
        a.iters = min(a.iters, 3)
    a.cases = ([c for c in CASES if not c.startswith("tutel")] if a.cases == "all"
               else [c for c in a.cases.split(",") if c])
    for c in a.cases:
        if c not in CASES:
            p.error("unknown case '%s' (choose from %s)" % (c, ",".join(CASES)))
    try:
        a.thread_list = [int(t) for t in a.threads.split(",") if t]
    except ValueError:
        p.error("--threads wants integers, got '%s'" % a.threads)
    if not a.thread_list or min(a.thread_list) < 1:
        p.error("--threads wants integers >= 1")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    for name in ("tokens", "experts", "top_k", "model_dim", "dense_T",
                 "hw_T", "hw_M", "hw_H", "hw_E", "hw_k"):
        if getattr(a, name) < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if a.top_k > a.experts or a.hw_k > a.hw_E:
        p.error("top-k must not exceed the expert count")
    return a


def spawn_children(a, argv):
    """One process per thread count, environment set before torch loads."""
    rc = 0
    for t in a.thread_list:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        rest, skip = [], False
        for x in argv:  # drop --threads, pass the rest through
            if skip:
                skip = False
                continue
            if x == "--threads":
                skip = True
                continue
            if x.startswith("--threads="):
                continue
            rest.append(x)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--threads", str(t)] + rest
        sys.stdout.flush()
        r = subprocess.call(cmd, env=env)
        rc = rc or r
    return rc


# ---- routing (Tutel's extract_critical, in plain torch) -----------------------------------

def capacity_of(torch, T, E, k, f, locations):
    """Tutel's capacity: f>0 fixed k*int(f*ceil(T/E)); 0 = max location + 1 (no drop);
    -x = the no-drop minimum capped at the fixed capacity of factor x."""
    base = (T + E - 1) // E
    if f > 0:
        return k * int(f * base)
    need = int(torch.max(torch.cat(locations))) + 1
    if f < 0:
        need = min(need, k * int(-f * base))
    return need


def route(torch, gates, k, f):
    """gates [T,E] probabilities -> indices_s, locations_s, scores_s (k lists of [T]), C.

    Location of token t in expert e for choice j: tokens of earlier choices fill the
    expert first (acc_base), then a running count in token order (exclusive cumsum)."""
    T, E = gates.shape
    topk = torch.topk(gates, k, dim=1).indices
    idx_s = [topk[:, j].contiguous() for j in range(k)]
    masks = [torch.nn.functional.one_hot(i, E).to(torch.int32) for i in idx_s]
    scores = [gates.gather(1, i.view(-1, 1)).view(-1) for i in idx_s]
    loc_s, acc = [], None
    for j in range(k):
        loc = torch.cumsum(masks[j], dim=0) - 1
        if acc is not None:
            loc = loc + acc
        loc_s.append((loc * masks[j]).sum(dim=1))
        acc = masks[j].sum(dim=0, keepdim=True) if acc is None else \
            acc + masks[j].sum(dim=0, keepdim=True)
    if k > 1:  # Tutel normalises the k scores of a token to sum to 1
        denom = torch.clamp(sum(scores), min=torch.finfo(gates.dtype).eps)
        scores = [s / denom for s in scores]
    C = capacity_of(torch, T, E, k, f, loc_s)
    return idx_s, loc_s, scores, C


class Plan:
    """Per-choice kept tokens and their rows in [E*C, M], computed once per routing."""

    def __init__(self, torch, idx_s, loc_s, C):
        self.tok, self.row, self.keep = [], [], []
        for i, l in zip(idx_s, loc_s):
            keep = l < C
            tok = torch.nonzero(keep).view(-1)
            self.keep.append(keep)
            self.tok.append(tok)
            self.row.append((i[tok] * C + l[tok]).contiguous())
        self.dropped = int(sum(int((~k).sum()) for k in self.keep))


def encode(torch, x, plan, E, C):
    """K0: out[idx*C+loc] += x[t] for kept tokens (postscore: no gate weight here)."""
    out = x.new_zeros((E * C, x.shape[1]))
    for tok, row in zip(plan.tok, plan.row):
        out.index_add_(0, row, x.index_select(0, tok))
    return out


def decode(torch, z, scores, plan, T):
    """K1: y[t] = sum_j score_j[t] * z[idx_j*C+loc_j] over kept choices."""
    y = z.new_zeros((T, z.shape[1]))
    for tok, row, s in zip(plan.tok, plan.row, scores):
        g = s.index_select(0, tok).view(-1, 1)
        y.index_add_(0, tok, z.index_select(0, row) * g)
    return y


# ---- timing ----------------------------------------------------------------------------

def timeit(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def emit(rec, ts, extra_ts=None):
    rec["iters"] = len(ts)
    rec["ms_median"] = round(statistics.median(ts), 3)
    rec["ms_min"] = round(min(ts), 3)
    rec["ms_max"] = round(max(ts), 3)
    rec["ms"] = [round(t, 3) for t in ts]
    rec["load1"] = round(os.getloadavg()[0], 2)  # other work on the machine, for judging noise
    if extra_ts:
        for k, v in extra_ts.items():
            rec[k + "_ms_median"] = round(statistics.median(v), 3)
    print(json.dumps(rec), flush=True)


def log(msg):
    print("bench-moe-torch: " + msg, file=sys.stderr, flush=True)


# ---- cases -------------------------------------------------------------------------------

def make_routing(torch, T, E, k, f, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    gates = torch.softmax(logits, dim=1)
    return route(torch, gates, k, f)


def case_encdec(torch, a, base):
    T, E, k, M = a.tokens, a.experts, a.top_k, a.model_dim
    g = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(T, M, generator=g)
    t0 = time.perf_counter()
    idx_s, loc_s, scores, C = make_routing(torch, T, E, k, a.factor, a.seed)
    plan = Plan(torch, idx_s, loc_s, C)
    route_ms = (time.perf_counter() - t0) * 1e3
    rec0 = dict(base, case="encdec", impl="index_add", T=T, E=E, k=k, M=M, f=a.factor, C=C,
                dropped=plan.dropped, route_ms=round(route_ms, 3),
                bytes_dispatch=E * C * M * 4)
    log("encdec T=%d E=%d k=%d M=%d C=%d threads=%d" % (T, E, k, M, C, base["threads"]))

    def fwd():
        with torch.no_grad():
            return decode(torch, encode(torch, x, plan, E, C), scores, plan, T)
    emit(dict(rec0, **{"pass": "fwd"}), timeit(fwd, a.iters, a.warmup))

    xg = x.clone().requires_grad_(True)
    sg = [s.detach().clone().requires_grad_(True) for s in scores]
    gy = torch.randn(T, M, generator=g)

    def fwdbwd():
        xg.grad = None
        for s in sg:
            s.grad = None
        y = decode(torch, encode(torch, xg, plan, E, C), sg, plan, T)
        y.backward(gy)
    emit(dict(rec0, **{"pass": "fwdbwd"}), timeit(fwdbwd, a.iters, a.warmup))

    # sanity: the sparse path against a naive per-token loop on a few tokens
    with torch.no_grad():
        y = fwd()
        z = encode(torch, x, plan, E, C)
        for t in (0, T // 2, T - 1):
            ref = torch.zeros(M)
            for j in range(k):
                if int(loc_s[j][t]) < C:
                    ref += scores[j][t] * z[int(idx_s[j][t]) * C + int(loc_s[j][t])]
                    assert torch.equal(z[int(idx_s[j][t]) * C + int(loc_s[j][t])], x[t])
            assert torch.allclose(y[t], ref, atol=1e-5), "decode mismatch at token %d" % t


def case_dense(torch, a, base):
    T, E, k, M = a.dense_T, a.experts, a.top_k, a.model_dim
    g = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(T, M, generator=g)
    idx_s, loc_s, scores, C = make_routing(torch, T, E, k, a.factor, a.seed)
    gb = T * E * C * 4 / 2**30
    note = "" if T == a.tokens else "dense run at T=%d, not the encdec T=%d" % (T, a.tokens)
    rec0 = dict(base, case="dense", impl="einsum", T=T, E=E, k=k, M=M, f=a.factor, C=C,
                combine_gib=round(gb, 3), note=note)
    log("dense T=%d E=%d k=%d M=%d C=%d combine %.2f GiB threads=%d"
        % (T, E, k, M, C, gb, base["threads"]))

    def build(scs):
        # combine[t,e,c] = sum_j score_j[t] [e == idx_j[t]] [c == loc_j[t]], dropped -> 0.
        # Written in place at the kept (t,e,c): a token's k choices are k distinct experts,
        # so no cell is written twice. (GShard builds it with einsum("TE,TC->TEC") per
        # choice, O(T*E*C) work more than this: this baseline is the generous one.)
        comb = x.new_zeros((T, E, C))
        flat_view = comb.view(-1)
        for i, l, s in zip(idx_s, loc_s, scores if scs is None else scs):
            tok = torch.nonzero(l < C).view(-1)
            flat = tok * (E * C) + i[tok] * C + l[tok]
            flat_view.index_put_((flat,), s.index_select(0, tok))
        return comb

    parts = {"build": [], "dispatch": [], "combine": []}

    def fwd(record=True, xin=None, scs=None):
        t0 = time.perf_counter()
        comb = build(scs)
        mask = (comb != 0).to(x.dtype)
        t1 = time.perf_counter()
        disp = torch.einsum("tec,tm->ecm", mask, x if xin is None else xin)
        t2 = time.perf_counter()
        y = torch.einsum("tec,ecm->tm", comb, disp)
        t3 = time.perf_counter()
        if record:
            parts["build"].append((t1 - t0) * 1e3)
            parts["dispatch"].append((t2 - t1) * 1e3)
            parts["combine"].append((t3 - t2) * 1e3)
        return y

    def fwd_nograd():
        with torch.no_grad():
            return fwd()
    ts = timeit(fwd_nograd, a.iters, a.warmup)
    for v in parts.values():
        del v[:len(v) - a.iters]
    emit(dict(rec0, **{"pass": "fwd"}), ts, parts)

    # check against the sparse path (the dense form is the oracle in the C tests too)
    with torch.no_grad():
        plan = Plan(torch, idx_s, loc_s, C)
        ys = decode(torch, encode(torch, x, plan, E, C), scores, plan, T)
        yd = fwd(record=False)
        err = float((ys - yd).abs().max())
        assert err < 1e-4, "dense and sparse disagree by %g" % err
    if a.dense_bwd:
        xg = x.clone().requires_grad_(True)
        sg = [s.detach().clone().requires_grad_(True) for s in scores]
        gy = torch.randn(T, M, generator=g)

        def fb():
            xg.grad = None
            fwd(record=False, xin=xg, scs=sg).backward(gy)
        emit(dict(rec0, **{"pass": "fwdbwd"}), timeit(fb, a.iters, a.warmup))


class HelloLayer:
    """Tutel helloworld's model: moe_layer(top-2 gate, ffn experts, relu) + log_softmax."""

    def __init__(self, torch, a):
        self.torch, self.a = torch, a
        T, M, H, E = a.hw_T, a.hw_M, a.hw_H, a.hw_E
        g = torch.Generator().manual_seed(a.seed + 2)
        nn = torch.nn
        s1, s2 = 1 / math.sqrt(M), 1 / math.sqrt(H)
        self.wg = nn.Parameter(torch.empty(E, M).uniform_(-s1, s1, generator=g))
        self.w1 = nn.Parameter(torch.empty(E, M, H).uniform_(-s1, s1, generator=g))
        self.b1 = nn.Parameter(torch.empty(E, 1, H).uniform_(-s1, s1, generator=g))
        self.w2 = nn.Parameter(torch.empty(E, H, M).uniform_(-s2, s2, generator=g))
        self.b2 = nn.Parameter(torch.empty(E, 1, M).uniform_(-s2, s2, generator=g))
        self.params = [self.wg, self.w1, self.b1, self.w2, self.b2]
        self.opt = torch.optim.SGD(self.params, lr=1e-5)
        self.x = torch.randn(T, M, generator=g).requires_grad_(a.hw_x_grad)
        self.batch = 16 if T % 16 == 0 else 1
        self.y = torch.zeros(self.batch, dtype=torch.long)
        self.C = None

    def experts(self, disp):
        h = torch_relu(self.torch, torch_baddbmm(self.torch, self.b1, disp, self.w1))
        return torch_baddbmm(self.torch, self.b2, h, self.w2)

    def step(self):
        torch, a = self.torch, self.a
        T, M, E, k = a.hw_T, a.hw_M, a.hw_E, a.hw_k
        self.opt.zero_grad()
        logits = self.x.matmul(self.wg.t())
        gates = torch.softmax(logits, dim=1)
        with torch.no_grad():
            idx_s, loc_s, _, C = route(torch, gates.detach(), k, a.hw_f)
            plan = Plan(torch, idx_s, loc_s, C)
        # scores keep their graph so the gate gets its gradient through decode (K2)
        scores = [gates.gather(1, i.view(-1, 1)).view(-1) for i in idx_s]
        if k > 1:
            denom = torch.clamp(sum(scores), min=torch.finfo(gates.dtype).eps)
            scores = [s / denom for s in scores]
        disp = encode(torch, self.x, plan, E, C).view(E, C, M)
        out = self.experts(disp).view(E * C, M)
        y = decode(torch, out, scores, plan, T)
        res = torch.log_softmax(y.view(self.batch, -1, M).sum(dim=2), dim=1)
        loss = torch.nn.functional.nll_loss(res, self.y)
        loss.backward()
        self.opt.step()
        self.C, self.dropped = C, plan.dropped
        return loss


def torch_relu(torch, t):
    return torch.relu(t)


def torch_baddbmm(torch, bias, a, b):
    # bias [E,1,N] broadcast over the capacity rows: one GEMM per expert plus the bias add
    return torch.baddbmm(bias, a, b)


def hw_flops(a, C, x_grad):
    """Expert GEMM FLOPs per step: fwd fc1+fc2 = 2 * 2ECMH; bwd dW1, dW2, dX2 = 3 * 2ECMH,
    plus dX1 when the input needs a gradient. Tutel helloworld's 'tflops' line counts
    T*M*H*4*3*min(k,E) instead (6 GEMMs over k*T rows whatever the capacity)."""
    E, M, H = a.hw_E, a.hw_M, a.hw_H
    g = 2 * E * C * M * H
    return (5 + (1 if x_grad else 0)) * g, a.hw_T * M * H * 4 * 3 * min(a.hw_k, a.hw_E)


def case_layer(torch, a, base):
    L = HelloLayer(torch, a)
    L.step()  # sets C
    gemm, tutel_flop = hw_flops(a, L.C, a.hw_x_grad)
    rec = dict(base, case="layer", impl="helloworld", T=a.hw_T, M=a.hw_M, H=a.hw_H, E=a.hw_E,
               k=a.hw_k, f=a.hw_f, C=L.C, dropped=L.dropped, x_grad=a.hw_x_grad,
               gemm_flop=gemm, tutel_flop=tutel_flop)
    rec["pass"] = "fwdbwd"
    log("layer T=%d M=%d H=%d E=%d k=%d C=%d threads=%d"
        % (a.hw_T, a.hw_M, a.hw_H, a.hw_E, a.hw_k, L.C, base["threads"]))
    ts = timeit(L.step, a.iters, max(a.warmup - 1, 0))
    med = statistics.median(ts)
    rec["gemm_gflops"] = round(gemm / med / 1e6, 2)
    emit(rec, ts)


def case_expert(torch, a, base):
    """The helloworld step's expert GEMMs alone, same shapes and autograd graph."""
    L = HelloLayer(torch, a)
    E, M = a.hw_E, a.hw_M
    # capacity as the layer sees it (f>0: fixed; else from the same routing)
    with torch.no_grad():
        gates = torch.softmax(L.x.detach().matmul(L.wg.detach().t()), dim=1)
        _, _, _, C = route(torch, gates, a.hw_k, a.hw_f)
    g = torch.Generator().manual_seed(a.seed + 3)
    disp = torch.randn(E, C, M, generator=g).requires_grad_(a.hw_x_grad)
    gy = torch.randn(E, C, M, generator=g)

    def fb():
        L.opt.zero_grad()
        L.experts(disp).backward(gy)
    gemm, _ = hw_flops(a, C, a.hw_x_grad)
    rec = dict(base, case="expert", impl="bmm", T=a.hw_T, M=M, H=a.hw_H, E=E, k=a.hw_k,
               f=a.hw_f, C=C, x_grad=a.hw_x_grad, gemm_flop=gemm)
    rec["pass"] = "fwdbwd"
    log("expert GEMMs E=%d C=%d M=%d H=%d threads=%d" % (E, C, M, a.hw_H, base["threads"]))
    ts = timeit(fb, a.iters, a.warmup)
    rec["gemm_gflops"] = round(gemm / statistics.median(ts) / 1e6, 2)
    emit(rec, ts)
    # plain sgemm rate at the fc1 shape, the yardstick moe-bench also reports
    A = torch.randn(C, M, generator=g)
    B = torch.randn(M, a.hw_H, generator=g)
    ts = timeit(lambda: torch.mm(A, B), a.iters, a.warmup)
    fl = 2 * C * M * a.hw_H
    r = dict(base, case="sgemm", impl="torch.mm", m=C, n=a.hw_H, kdim=M, flop=fl)
    r["pass"] = "fwd"
    r["gflops"] = round(fl / statistics.median(ts) / 1e6, 2)
    emit(r, ts)


def case_copy(torch, a, base):
    # same bytes as the encode output [E*C, M] of the encdec case at factor 1
    T, E, k, M = a.tokens, a.experts, a.top_k, a.model_dim
    C = k * int((a.factor if a.factor > 0 else 1.0) * ((T + E - 1) // E))
    n = E * C * M
    src = torch.randn(n)
    rec = dict(base, case="copy", impl="clone", bytes=n * 4)
    rec["pass"] = "fwd"
    log("copy %.1f MiB threads=%d" % (n * 4 / 2**20, base["threads"]))
    ts = timeit(lambda: src.clone(), a.iters, a.warmup)
    rec["gbps_rw"] = round(2 * n * 4 / statistics.median(ts) / 1e6, 2)
    emit(rec, ts)
    # the same copy into a destination allocated once: no page faults, the memcpy ceiling
    dst = torch.empty_like(src)
    dst.copy_(src)
    rec = dict(rec, impl="copy_")
    ts = timeit(lambda: dst.copy_(src), a.iters, a.warmup)
    rec["gbps_rw"] = round(2 * n * 4 / statistics.median(ts) / 1e6, 2)
    emit(rec, ts)


def tutel_case_rec(base, case, **kw):
    import tutel
    return dict(base, case=case, impl="tutel", tutel_path=os.path.dirname(
        os.path.dirname(os.path.abspath(tutel.__file__))), **kw)


def case_tutel_encdec(torch, a, base):
    from tutel.impls.fast_dispatch import extract_critical, fast_encode, fast_decode
    T, E, k, M = a.tokens, a.experts, a.top_k, a.model_dim
    g = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(T, M, generator=g)
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(a.seed))
    crit, _ = extract_critical(torch.softmax(logits, dim=1), top_k=k, capacity_factor=a.factor)
    loc, scores, C = crit[2], crit[3], crit[4]
    kept = sum(int((l < C).sum()) for l in loc)
    rec0 = tutel_case_rec(base, "tutel-encdec", T=T, E=E, k=k, M=M, f=a.factor, C=C,
                          dropped=k * T - kept, bytes_dispatch=E * C * M * 4)
    log("tutel encdec T=%d E=%d k=%d M=%d C=%d threads=%d" % (T, E, k, M, C, base["threads"]))

    def fwd():
        with torch.no_grad():
            return fast_decode(fast_encode(x, crit), crit)
    emit(dict(rec0, **{"pass": "fwd"}), timeit(fwd, a.iters, a.warmup))

    xg = x.clone().requires_grad_(True)
    sg = [s.detach().clone().requires_grad_(True) for s in scores]
    cg = tuple(crit[:3]) + (sg,) + tuple(crit[4:])
    gy = torch.randn(T, M, generator=g)

    def fwdbwd():
        xg.grad = None
        for s in sg:
            s.grad = None
        fast_decode(fast_encode(xg, cg), cg).backward(gy)
    emit(dict(rec0, **{"pass": "fwdbwd"}), timeit(fwdbwd, a.iters, a.warmup))

    # sanity: with identity experts, token t comes back as (its kept gate scores summed) * x[t]
    with torch.no_grad():
        y = fwd()
        for t in (0, T // 2, T - 1):
            s = sum(float(scores[j][t]) for j in range(k) if int(loc[j][t]) < C)
            assert torch.allclose(y[t], s * x[t], atol=1e-5), "tutel decode at token %d" % t


def case_tutel_layer(torch, a, base):
    from tutel import moe as tutel_moe
    T, M, H, E, k = a.hw_T, a.hw_M, a.hw_H, a.hw_E, a.hw_k
    layer = tutel_moe.moe_layer(
        gate_type={"type": "top", "k": k, "capacity_factor": a.hw_f},
        experts={"type": "ffn", "count_per_node": E, "hidden_size_per_expert": H,
                 "activation_fn": torch.relu},
        model_dim=M, seeds=(a.seed, a.seed, a.seed),
        scan_expert_func=lambda name, p: setattr(p, "skip_allreduce", True))
    batch = 16 if T % 16 == 0 else 1
    g = torch.Generator().manual_seed(a.seed + 2)
    x = torch.randn(batch, T // batch, M, generator=g).requires_grad_(a.hw_x_grad)
    target = torch.zeros(batch, dtype=torch.long)
    opt = torch.optim.SGD(layer.parameters(), lr=1e-5)

    def step():
        opt.zero_grad()
        res = torch.log_softmax(layer(x).sum(dim=2), dim=1)
        torch.nn.functional.nll_loss(res, target).backward()
        opt.step()
    C = k * int(a.hw_f * ((T + E - 1) // E)) if a.hw_f > 0 else None
    gemm = hw_flops(a, C, a.hw_x_grad)[0] if C else None
    rec = tutel_case_rec(base, "tutel-layer", T=T, M=M, H=H, E=E, k=k, f=a.hw_f, C=C,
                         x_grad=a.hw_x_grad, gemm_flop=gemm)
    rec["pass"] = "fwdbwd"
    log("tutel layer T=%d M=%d H=%d E=%d k=%d threads=%d" % (T, M, H, E, k, base["threads"]))
    step()
    ts = timeit(step, a.iters, max(a.warmup - 1, 0))
    if gemm:
        rec["gemm_gflops"] = round(gemm / statistics.median(ts) / 1e6, 2)
    emit(rec, ts)


def child(a):
    import torch
    t = a.thread_list[0]
    torch.set_num_threads(t)
    torch.manual_seed(a.seed)
    base = {"tool": "torch", "threads": t}
    env = dict(base, case="env", torch=torch.__version__, torch_threads=torch.get_num_threads(),
               omp=os.environ.get("OMP_NUM_THREADS"),
               openblas=os.environ.get("OPENBLAS_NUM_THREADS"),
               omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
               load1=round(os.getloadavg()[0], 2), ncpu=os.cpu_count())
    print(json.dumps(env), flush=True)
    fns = {"encdec": case_encdec, "dense": case_dense, "layer": case_layer,
           "expert": case_expert, "copy": case_copy, "tutel-encdec": case_tutel_encdec,
           "tutel-layer": case_tutel_layer}
    for c in a.cases:
        fns[c](torch, a, base)
    return 0


def main():
    argv = sys.argv[1:]
    a = parse_args(argv)
    if a.child:
        return child(a)
    return spawn_children(a, argv)


if __name__ == "__main__":
    sys.exit(main())
