#!/usr/bin/env python3
"""torch_gpt2_bench.py - training throughput of our GPT-2 in plain PyTorch, for comparison with
dpc-train-path on the same GPU (test/gpu, not shipped).

The model is the one of lib/model/gpt2.h and test/ref/gpt2_torch.py: pre-LayerNorm blocks
(eps 1e-5), causal multi-head attention with c_attn output [q | k | v], tanh-GELU MLP of width
4C, learned position embeddings, final LayerNorm, untied lm_head without bias, Hugging Face
Conv1D layout y = x W + b with W [in, out], biases everywhere except lm_head. Parameter names
and shapes are checked against gpt2_torch.param_shapes, and (unless --no-check) the loss and
every gradient of a tiny model are checked against gpt2_torch.forward in float64 on the CPU, for
each attention variant, before anything is timed.

One timed step = zero_grad + forward + mean cross-entropy + backward + global-norm gradient
clipping (--grad-clip, default 1.0 as configs/*.yaml; 0 = off) + AdamW (lr 3e-4, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1 on the matrices and embeddings only, as the trainer;
implementation --adamw, default foreach) + reading the loss back to the host (one sync per
step, as our trainer reads the loss). The batch is B x T random tokens in [0, V), the same every
step. Wall-clock per step (perf_counter around a synchronised step); the median of --iters
steps after --warmup steps is reported. fp32 with TF32 off (--tf32 turns it on; --bf16 runs the
forward and the loss under torch.autocast to bfloat16, PyTorch's usual mixed precision: fp32
parameters, AdamW state and gradients, bfloat16 matmul operands). The correctness check always
runs in fp32 with TF32 off, before either is switched on.

Runs: eager with each attention of --attention (manual: softmax(QK^T/sqrt(d)) with a causal
mask, over the full T x T matrix, as gpt2_torch.py; sdpa: F.scaled_dot_product_attention with
is_causal=True), then torch.compile with each attention of --compile-attention (default sdpa
only: compiling the 12-layer model takes tens of seconds). torch.compile wraps the whole model
with its loss (--compile-scope blocks: each block instead); the optimizer step and clipping
stay eager; compile time is excluded from the timing and reported as compile_s (first step
minus the median step). A run that fails reports its error string and the next one goes on.

stdout: one JSON object on one line. stderr: progress.
Exit status: 0 ok, 1 the correctness check failed, 2 usage error.
"""
import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

PROG = "torch_gpt2_bench.py"
HERE = os.path.dirname(os.path.abspath(__file__))
REF_DIR = os.path.normpath(os.path.join(HERE, "..", "ref"))


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


# ---- precision ----------------------------------------------------------------------------
def set_fp32_precision(tf32):
    """TF32 off (or on) for matmuls and cuDNN. torch >= 2.9 has the fp32_precision API, and
    mixing it with the legacy allow_tf32 flags can raise RuntimeError (inductor checks it), so
    there only the new API is used ('ieee' = full fp32); older torch gets the legacy flags and
    set_float32_matmul_precision. Returns what was set, for the JSON."""
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
            except Exception as e:  # report, do not die: the check below shows the effect
                out[name] = f"not set ({err_str(e)})"
        return out
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return {"api": "allow_tf32", "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


# ---- the model ----------------------------------------------------------------------------
class Conv1D(nn.Module):
    """Hugging Face Conv1D: y = x W + b, W [in, out] (the layout of our checkpoints)."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return y.view(x.shape[0], x.shape[1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, C, NH, T, attention):
        super().__init__()
        self.C, self.NH, self.hs, self.attention = C, NH, C // NH, attention
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)
        if attention == "manual":
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1),
                                 persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        NH, hs = self.NH, self.hs
        q, k, v = self.c_attn(x).split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(self.mask[:T, :T], float("-inf"))
            y = att.softmax(dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH, T, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, NH, T, attention)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Parameter names and shapes are those of gpt2_torch.param_shapes (HF GPT-2 names)."""

    def __init__(self, L, C, NH, T, V, attention):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, T, attention) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)  # weight [V, C], logits = x W^T, untied

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:T]
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def init_gpt2(model, L, gen=None, scale=None):
    """GPT-2 init as lib/model/gpt2.h (other random numbers): matrices and embeddings N(0, 0.02),
    residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. With scale, every
    tensor is N(0, scale) (LayerNorm weights 1 + N(0, scale)): a stronger correctness check."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.device)
            if scale is not None:
                p.copy_((1.0 if (".ln_" in name or name.startswith("ln_f")) and
                         name.endswith("weight") else 0.0) + scale * r)
            elif name.endswith(".bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("ln_f"):
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
                p.copy_(std * r)


def import_ref():
    if REF_DIR not in sys.path:
        sys.path.insert(0, REF_DIR)
    import gpt2_torch  # noqa: E402  (test/ref/gpt2_torch.py)
    return gpt2_torch


def check_layout(model, m):
    """Names and shapes against the reference's list, in order. Returns an error or None."""
    ref = import_ref()
    want = [(n, tuple(s)) for n, s in ref.param_shapes(m)]
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    if want != got:
        diff = [(a, b) for a, b in zip(want, got) if a != b][:3]
        return ("parameter layout differs from gpt2_torch.param_shapes: "
                f"{diff or (len(want), len(got))}")
    return None


def check_against_ref(dev, attention, V, seed):
    """Loss and all gradients of a tiny model (float32 on dev) against gpt2_torch.forward in
    float64 on the CPU, same parameters and tokens."""
    ref = import_ref()
    m = {"n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": V}
    B, T = 2, m["seq_len"]
    gen = torch.Generator().manual_seed(seed + 1000)
    model = GPT2(m["n_layer"], m["n_embd"], m["n_head"], T, V, attention).to(dev)
    bad = check_layout(model, m)
    if bad:
        return {"ok": False, "error": bad}
    init_gpt2(model, m["n_layer"], gen, scale=0.1)
    tok = torch.randint(0, V, (B, T + 1), generator=gen)
    x, y = tok[:, :T].contiguous(), tok[:, 1:].contiguous()
    P = {n: p.detach().cpu().double().requires_grad_(True) for n, p in model.named_parameters()}
    ref_loss, _ = ref.forward(P, x, y, m)
    ref_loss.backward()
    loss = model(x.to(dev), y.to(dev))
    loss.backward()
    loss_rel = abs(float(loss) - float(ref_loss)) / abs(float(ref_loss))
    worst, worst_name = 0.0, None
    for n, p in model.named_parameters():
        g, rg = p.grad.detach().cpu().double(), P[n].grad
        e = float((g - rg).abs().max()) / max(float(rg.abs().max()), 1e-30)
        if e > worst:
            worst, worst_name = e, n
    # float32 (TF32 off) against float64 gives ~1e-6; TF32 on would give ~1e-3.
    ok = loss_rel <= 1e-5 and worst <= 1e-4
    return {"ok": ok, "loss_rel_err": loss_rel, "grad_max_rel_err": worst,
            "worst_tensor": worst_name}


# ---- timing -------------------------------------------------------------------------------
def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def make_optimizer(model, args, dev):
    decay = [p for p in model.parameters() if p.dim() == 2]
    nodecay = [p for p in model.parameters() if p.dim() != 2]
    kw = {}
    if args.adamw == "foreach":
        kw["foreach"] = True
    elif args.adamw == "forloop":
        kw["foreach"] = False
    elif args.adamw == "fused":
        kw["fused"] = True
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": nodecay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, **kw)


def sdpa_info(dev, NH, T, hs):
    """Which SDPA backends accept fp32 inputs of this shape (each tried alone, forward and
    backward), and the one the dispatcher picks. On CUDA fp32 excludes flash and cuDNN; the
    memory-efficient kernel runs fp32 on tensor cores with 3xTF32 (CUTLASS
    OpMultiplyAddFastF32) on sm80+, whatever the TF32 flags say."""
    info = {}
    if not hasattr(F, "scaled_dot_product_attention"):
        return {"error": f"torch {torch.__version__} has no F.scaled_dot_product_attention"}
    q = torch.randn(1, NH, T, hs, device=dev, requires_grad=True)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:
        return {"error": err_str(e)}
    usable = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        be = getattr(SDPBackend, name, None)
        if be is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with sdpa_kernel(be):
                    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            sync(dev)
            usable.append(name.lower())
        except Exception:
            pass
    info["usable"] = usable
    try:
        with torch.no_grad():
            c = int(torch._fused_sdp_choice(q, q, q, None, 0.0, True))
        names = {int(v.value): k.lower() for k, v in SDPBackend.__members__.items()}
        info["chosen"] = names.get(c, str(c))
    except Exception as e:
        info["chosen"] = f"unknown ({err_str(e)})"
    return info


def cleanup(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def bench_run(args, dev, mode, attention):
    run = {"mode": mode, "attention": attention}
    L, C, NH, T, V, B = args.layers, args.channels, args.heads, args.seq_len, args.vocab, args.batch
    model = opt = fn = None
    try:
        torch.manual_seed(args.seed)
        model = GPT2(L, C, NH, T, V, attention).to(dev)
        init_gpt2(model, L, torch.Generator().manual_seed(args.seed))
        opt = make_optimizer(model, args, dev)
        params = list(model.parameters())
        gen = torch.Generator().manual_seed(args.seed + 1)
        tok = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = tok[:, :T].contiguous().to(dev), tok[:, 1:].contiguous().to(dev)
        fn = model
        if mode == "compile":
            if not hasattr(torch, "compile"):
                raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
            kw = {"mode": args.compile_mode} if args.compile_mode else {}
            if args.compile_scope == "model":
                fn = torch.compile(model, **kw)
            else:  # regional: each block compiled in place (one compile serves all L blocks)
                for blk in model.h:
                    blk.compile(**kw)
            run["compile_scope"] = args.compile_scope

        def autocast():
            if args.bf16:
                return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
            return contextlib.nullcontext()

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = fn(x, y)
            loss.backward()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
            opt.step()
            return loss.item()  # the host reads the loss: one sync, as our trainer

        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        warm = []
        for i in range(args.warmup):
            sync(dev)
            t0 = time.perf_counter()
            loss0 = step()
            sync(dev)
            warm.append(time.perf_counter() - t0)
            log(f"  {mode}/{attention} warmup {i + 1}/{args.warmup}: {warm[-1] * 1e3:.1f} ms"
                f" loss {loss0:.4f}")
        times = []
        for i in range(args.iters):
            sync(dev)
            t0 = time.perf_counter()
            loss = step()
            sync(dev)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        run.update({"step_ms": med * 1e3, "tok_per_s": B * T / med,
                    "step_ms_min": min(times) * 1e3, "step_ms_max": max(times) * 1e3,
                    "step_ms_mean": statistics.mean(times) * 1e3, "iters": len(times),
                    "warmup": args.warmup, "loss_last": loss})
        if warm:
            run["first_step_s"] = warm[0]
            if mode == "compile":  # the first step compiles forward and backward
                run["compile_s"] = max(warm[0] - med, 0.0)
        if dev.type == "cuda":
            run["peak_mem_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        if not math.isfinite(loss):
            run["warning"] = "loss not finite"
        log(f"{mode}/{attention}: {med * 1e3:.2f} ms/step (median of {len(times)}), "
            f"{B * T / med:,.0f} tok/s")
    except Exception as e:
        run["error"] = err_str(e)
        log(f"{mode}/{attention} failed: {run['error']}")
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
    finally:
        model = opt = fn = params = x = y = None  # noqa: F841 (free them before the next run)
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
    p.add_argument("-L", "--layers", type=int, default=12, help="n_layer (default 12)")
    p.add_argument("-C", "--channels", type=int, default=768, help="n_embd (default 768)")
    p.add_argument("--heads", "--nh", type=int, default=12, help="n_head (default 12)")
    p.add_argument("-T", "--seq-len", type=int, default=1024, help="context T (default 1024)")
    p.add_argument("-V", "--vocab", type=int, default=256, help="vocab_size (default 256)")
    p.add_argument("-B", "--batch", type=int, default=8, help="batch size B (default 8)")
    p.add_argument("--attention", choices=["manual", "sdpa", "both"], default="both",
                   help="attention of the eager runs (default both)")
    p.add_argument("--compile-attention", choices=["manual", "sdpa", "both", "none"],
                   default="sdpa", help="attention of the compiled runs (default sdpa; none: "
                   "no compiled run)")
    p.add_argument("--modes", default="eager,compile",
                   help="comma-separated subset of eager,compile (default both)")
    p.add_argument("--compile-scope", choices=["model", "blocks"], default="model",
                   help="torch.compile of the whole model with its loss (default), or of each "
                   "transformer block (regional compilation: compiles in a fraction of the "
                   "time; embeddings, ln_f, lm_head and the loss stay eager)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: torch's default)")
    p.add_argument("--iters", "-n", "--iterations", type=int, default=10,
                   help="timed steps (default 10)")
    p.add_argument("--warmup", "-w", type=int, default=3, help="untimed steps (default 3)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="global-norm clipping as the trainer (default 1.0; 0 = off)")
    p.add_argument("--adamw", choices=["foreach", "fused", "forloop"], default="foreach",
                   help="torch.optim.AdamW implementation (default foreach, torch's default "
                   "on CUDA; fused: one fused kernel; forloop: foreach=False)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 (default: off, fp32)")
    p.add_argument("--bf16", action="store_true",
                   help="forward and loss under torch.autocast(bfloat16) (default: off)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the correctness check against test/ref/gpt2_torch.py")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failed runs")
    a = p.parse_args(argv)
    if min(a.layers, a.channels, a.heads, a.seq_len, a.vocab, a.batch, a.iters) < 1 or \
            a.warmup < 0 or a.channels % a.heads:
        p.error("sizes must be >= 1, warmup >= 0 and C a multiple of the number of heads")
    modes = [m for m in a.modes.split(",") if m]
    if not modes or any(m not in ("eager", "compile") for m in modes):
        p.error("--modes: a comma-separated subset of eager,compile")
    a.mode_list = modes
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
    precision = set_fp32_precision(False)  # the check is fp32; --tf32 is set after it
    L, C, NH, T, V, B = args.layers, args.channels, args.heads, args.seq_len, args.vocab, args.batch
    out = {"bench": "torch_gpt2", "B": B, "T": T, "L": L, "C": C, "NH": NH, "V": V}
    # V C (wte) + T C (wpe) + L (12 C^2 + 13 C) + 2 C (ln_f) + V C (lm_head, untied)
    out["params"] = 2 * V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    out.update({
        "dtype": "float32", "tf32": bool(args.tf32), "autocast": "bfloat16" if args.bf16
        else None,
        "optimizer": {"name": "AdamW", "impl": args.adamw, "lr": args.lr,
                      "betas": [args.beta1, args.beta2], "eps": args.eps,
                      "weight_decay": args.weight_decay, "decay_on": "2-D tensors",
                      "grad_clip": args.grad_clip},
        "step": "zero_grad + forward + mean cross-entropy + backward + clip + AdamW + "
                "loss.item(); wall clock, synchronised; median",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
        or platform.machine(),
        "python": platform.python_version(), "threads": torch.get_num_threads(),
        "iters": args.iters, "warmup": args.warmup,
    })
    log(f"GPT-2 L={L} C={C} NH={NH} T={T} V={V} B={B}: {out['params']:,} parameters on "
        f"{out['device']} (torch {torch.__version__}, fp32, TF32 {'on' if args.tf32 else 'off'}"
        f"{', autocast bf16' if args.bf16 else ''})")

    eager_att = ["manual", "sdpa"] if args.attention == "both" else [args.attention]
    comp_att = {"both": ["manual", "sdpa"], "none": []}.get(args.compile_attention,
                                                           [args.compile_attention])
    if dev.type == "cuda" and ("sdpa" in eager_att or "sdpa" in comp_att):
        try:
            out["sdpa"] = sdpa_info(dev, NH, T, C // NH)
        except Exception as e:
            out["sdpa"] = {"error": err_str(e)}
        cleanup(dev)
        log(f"sdpa backends: {out['sdpa']}")

    check_ok = True
    if args.check:
        out["check"] = {}
        for att in sorted(set(eager_att) | set(comp_att)):
            try:
                r = check_against_ref(dev, att, V, args.seed)
            except Exception as e:
                r = {"ok": None, "error": err_str(e)}
            out["check"][att] = r
            if r.get("ok") is False:
                check_ok = False
            log(f"check {att} against test/ref/gpt2_torch.py (float64, CPU): {r}")
        cleanup(dev)

    out["precision"] = set_fp32_precision(args.tf32)
    runs = []
    for mode in args.mode_list:
        for att in (eager_att if mode == "eager" else comp_att):
            log(f"run {mode}/{att}: {args.warmup} warmup + {args.iters} timed steps")
            runs.append(bench_run(args, dev, mode, att))
    out["runs"] = runs
    out["check_ok"] = check_ok
    print(json.dumps(finite(out), separators=(",", ":")), flush=True)
    return 0 if check_ok else 1


if __name__ == "__main__":
    sys.exit(main())
