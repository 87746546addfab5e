#!/usr/bin/python3
"""bench-train-torch.py - PyTorch eager training speed of the model of test/ref/gpt2_torch.py
(the independent reference), with the same config, batch sampling, clipping and AdamW as
dpc-train-path, next to dpc-train-path's own figures: the table scripts/bench-train.sh prints.

  bench-train-torch.py -c CONFIG -d TOKENS [-n N] [--threads 1,2] [--settings LIST]
                       [--ours T=JSON]... [--ours-metrics T=JSONL]...

For each thread count, a fresh Python process per PyTorch setting (default: its own threads;
passive: OMP_WAIT_POLICY=PASSIVE; blas: one intra-op thread, OpenBLAS threads) trains for the
steps and reports the median step time after the warm-up; the best setting is compared with
ours. Run with /usr/bin/python3 (Debian's torch). The model code is the oracle's, imported,
so that what is timed is what the reference tests check; the oracle itself holds no timing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "ref"))
import gpt2_torch as ref  # noqa: E402


# ---- benchmark --------------------------------------------------------------------------------
def memory_bound(m, B):
    """Bytes that training must hold: params, grads, AdamW m and v (4 x P floats) plus the
    forward activations backward needs, counted as llm.c's ActivationTensors (float32):
      encoded BTC; per layer: ln1 BTC, ln1_mean/rstd 2BT, qkv 3BTC, atty BTC,
      preatt and att 2*B*NH*T*T, attproj BTC, residual2 BTC, ln2 BTC, ln2_mean/rstd 2BT,
      fch 4BTC, fch_gelu 4BTC, fcproj BTC, residual3 BTC;
      lnf BTC, lnf_mean/rstd 2BT, logits BTV, probs BTV, losses BT."""
    L, C, NH, T, V = (m[k] for k in ("n_layer", "n_embd", "n_head", "seq_len", "vocab_size"))
    nparams = sum(int(np.prod(s)) for _, s in ref.param_shapes(m))
    per_layer = B * T * (18 * C + 4) + 2 * B * NH * T * T
    acts = B * T * C + L * per_layer + B * T * (C + 2 + 2 * V + 1)
    # Flash-style attention keeps one logsumexp per (b, head, t) instead of preatt and att.
    acts_flash = acts - L * (2 * B * NH * T * T - B * NH * T)
    return {"params": nparams, "state_bytes": 16 * nparams, "act_bytes": 4 * acts,
            "total_bytes": 16 * nparams + 4 * acts,
            "total_flash_bytes": 16 * nparams + 4 * acts_flash}


SETTINGS = {  # name -> (torch intra-op threads, environment) for n threads
    "default": lambda n: (n, {"OMP_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n)}),
    "passive": lambda n: (n, {"OMP_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n),
                              "OMP_WAIT_POLICY": "PASSIVE"}),
    "blas": lambda n: (1, {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": str(n)}),
}


def cmd_bench_one(a):
    """Runs in a fresh process whose environment the parent set: torch eager training."""
    import contextlib
    import torch
    torch.set_num_threads(a.intra)
    torch.set_num_interop_threads(1)
    # as ours flushes them (every cpu backend thread): subnormals slow x86 arithmetic
    torch.set_flush_denormal(True)
    # bf16: autocast's CPU products in bfloat16 (oneDNN), fp32 master weights and AdamW
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.bf16 else \
        contextlib.nullcontext
    cfg, model = ref.load_config(a.config, a.set)
    m = {k: int(model[k]) for k in ref.MODEL_KEYS}
    if model.get("moe"):  # MoE blocks: the reference's plain PyTorch MoE (gpt2_torch.py)
        m["moe"] = model["moe"]
    toks = ref.read_tokens(a.data)
    T = m["seq_len"]
    params = ref.to_torch(ref.init_params(m, cfg["seed"]), torch.float32)
    names = [n for n, _ in ref.param_shapes(m)]
    extra = []  # Tutel's layers' parameters, when they stand in for the MoE blocks
    if a.tutel:
        if "moe" not in m:
            ref.die("--tutel: the config has no MoE blocks")
        layers = tutel_blocks(torch, m)
        names = [n for n in names if ".moe." not in n]
        extra = [q for lay in layers.values() for q in lay.parameters()]
    for n in names:
        params[n].requires_grad_(True)
    def decays(n):  # matrices, not biases (an MoE block's are [E, n])
        return params[n].dim() >= 2 and not n.endswith(".bias")
    opt = torch.optim.AdamW(
        [{"params": [params[n] for n in names if decays(n)]
          + [q for q in extra if q.dim() >= 2], "weight_decay": cfg["weight_decay"]},
         {"params": [params[n] for n in names if not decays(n)]
          + [q for q in extra if q.dim() < 2], "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    times = []
    for s in range(a.warmup + a.steps):
        if len(times) >= 5 and sum(times) > a.max_seconds:
            break  # keeps the benchmark short on a loaded machine; the count is reported
        x, y = ref.get_batch(toks, ref.batch_starts(cfg, len(toks), T, s), T)
        t0 = time.perf_counter()
        auxes = []
        with amp():
            loss, _ = ref.forward(params, x, y, m, aux_out=auxes, train=True)
        objective = loss
        if auxes:
            objective = loss + m["moe"]["aux_weight"] * sum(a for a, _ in auxes)
        opt.zero_grad(set_to_none=True)
        objective.backward()
        grads = [params[n].grad for n in names] + [q.grad for q in extra]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        if cfg["grad_clip"] > 0 and float(norm) > cfg["grad_clip"]:
            for g in grads:
                g.mul_(cfg["grad_clip"] / float(norm))
        for grp in opt.param_groups:
            grp["lr"] = ref.lr_at(cfg, s)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    print(json.dumps({"tokens_per_s": cfg["batch_size"] * T / med, "median_step_s": med,
                      "timed_steps": len(times), "bf16": a.bf16, "tutel": bool(a.tutel),
                      "loss": float(loss), "peak_rss_mb": rss, "intra_threads": a.intra,
                      "torch_threads": torch.get_num_threads()}))


def tutel_blocks(torch, m):
    """Tutel's moe_layer for each MoE block of the model (its own parameters: a speed
    comparison, not a numerical one), made as Tutel's examples/helloworld.py makes it, with
    the block's experts, top-k, capacity factor, batch-prioritized routing, GELU (tanh) and
    the GShard loss; ref.moe_forward then runs it in place of the reference's MoE."""
    from tutel import moe as tutel_moe
    import torch.nn.functional as F
    mo, C, L = m["moe"], m["n_embd"], m["n_layer"]
    layers = {}
    for i in sorted(ref.moe_blocks(mo, L)):
        layers[f"h.{i}."] = tutel_moe.moe_layer(
            gate_type={"type": "top", "k": mo["top_k"], "capacity_factor":
                       mo["capacity_factor"], "gate_noise": mo["gate_noise"]},
            experts={"type": "ffn", "count_per_node": mo["experts"],
                     "hidden_size_per_expert": 4 * C,
                     "activation_fn": lambda z: F.gelu(z, approximate="tanh")},
            model_dim=C, seeds=(1, 2 + i, 3), batch_prioritized_routing=mo["bpr"],
            is_gshard_loss=True,
            scan_expert_func=lambda name, p: setattr(p, "skip_allreduce", True))

    def moe_forward(h, P, p, mo, gelu, mutate=None, train=True):
        y = layers[p](h)
        return y, y.l_aux, {"C": None, "need": None, "dropped": None}
    ref.moe_forward = moe_forward
    return layers


def run_torch(a, threads, setting):
    intra, env = SETTINGS[setting](threads)
    e = dict(os.environ)
    for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        e.pop(k, None)
    e.update(env)
    cmd = [sys.executable, os.path.abspath(__file__), "one", "-c", a.config, "-d", a.data,
           "-n", str(a.steps), "--warmup", str(a.warmup), "--intra", str(intra),
           "--max-seconds", str(a.max_seconds)]
    for s in a.set or []:
        cmd += ["-s", s]
    if a.tutel:
        cmd += ["--tutel"]
    t0 = time.time()
    r = subprocess.run(cmd, env=e, capture_output=True, text=True)
    if r.returncode != 0:
        ref.die(f"torch bench ({setting}, {threads} threads) failed: {r.stderr.strip()[-500:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"  torch {threads} thread(s), {setting:7s}: {res['tokens_per_s']:9.0f} tok/s "
          f"(median of {res['timed_steps']} steps {res['median_step_s'] * 1000:.0f} ms, peak RSS "
          f"{res['peak_rss_mb']:.0f} MiB; {time.time() - t0:.0f} s)", file=sys.stderr)
    return res


def cmd_bench(a):
    cfg, model = ref.load_config(a.config, a.set)
    m = {k: int(model[k]) for k in ref.MODEL_KEYS}
    if model.get("moe"):
        m["moe"] = model["moe"]
    ours = {}
    for o in a.ours or []:
        t, path = o.split("=", 1)
        try:
            with open(path) as f:
                ours[int(t)] = json.loads(f.read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as e:
            ref.die(f"cannot read '{path}': {e}")
    for o in a.ours_metrics or []:  # per-step tokens/s: the median after the same warm-up
        t, path = o.split("=", 1)
        try:
            with open(path) as f:
                ev = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError) as e:
            ref.die(f"cannot read '{path}': {e}")
        tps = [e["tokens_per_s"] for e in ev if e.get("event") == "train"][a.warmup:]
        if tps and int(t) in ours:
            ours[int(t)]["median_tokens_per_s"] = statistics.median(tps)
            ours[int(t)]["median_steps"] = len(tps)
    threads = [int(t) for t in a.threads.split(",")]
    mb = memory_bound(m, cfg["batch_size"])
    rows = []
    for n in threads:
        settings = ["default"] if n == 1 else a.settings.split(",")
        res = {s: run_torch(a, n, s) for s in settings}
        best = max(res, key=lambda s: res[s]["tokens_per_s"])
        rows.append((n, ours.get(n), res[best], best))
    mib = 1 << 20
    print(f"config {a.config}: L={m['n_layer']} C={m['n_embd']} NH={m['n_head']} "
          f"T={m['seq_len']} V={m['vocab_size']} B={cfg['batch_size']}, {mb['params']} params; "
          f"ours: {a.steps} steps; torch: median step time after {a.warmup} warm-up steps")
    print(f"memory bound: 16 B x params = {mb['state_bytes'] / mib:.1f} MiB (params, grads, "
          f"AdamW m, v) + activations {mb['act_bytes'] / mib:.1f} MiB (llm.c "
          f"ActivationTensors, fp32) = {mb['total_bytes'] / mib:.1f} MiB; with flash-style "
          f"attention (no B*NH*T*T preatt/att, one logsumexp per row) "
          f"{mb['total_flash_bytes'] / mib:.1f} MiB"
          + ("; the MoE blocks' activations counted as dense MLPs' (their dispatch buffers are "
             "not)" if "moe" in m else ""))
    print(f"{'threads':>7} {'ours tok/s':>10} {'(own JSON)':>10} {'torch tok/s':>11} "
          f"{'(setting)':>10} {'ours/torch':>10} {'ours RSS':>8} {'bound':>6} {'RSS/bound':>9} "
          f"{'/flash':>6} {'torch RSS':>9} {'matmul_frac':>11}")

    def fmt(v, f):
        return f"{v:{f}}" if isinstance(v, (int, float)) else f"{'-':>{f.split('.')[0]}}"
    for n, o, t, best in rows:
        own = o.get("tokens_per_s") if o else None
        ot = o.get("median_tokens_per_s", own) if o else None
        rss = o.get("peak_rss_mb") if o else None
        mf = o.get("matmul_frac") if o else None
        print(f"{n:>7} {fmt(ot, '10.0f')} {fmt(own, '10.0f')} {t['tokens_per_s']:>11.0f} "
              f"{'(' + best + ')':>10} "
              f"{fmt(ot / t['tokens_per_s'] if ot else None, '10.2f')} {fmt(rss, '8.0f')} "
              f"{mb['total_bytes'] / mib:>6.0f} "
              f"{fmt(rss * mib / mb['total_bytes'] if rss else None, '9.2f')} "
              f"{fmt(rss * mib / mb['total_flash_bytes'] if rss else None, '6.2f')} "
              f"{t['peak_rss_mb']:>9.0f} {fmt(mf, '11.3f')}")
    print("tok/s: median over the steps after the warm-up, B*T / step time, for both (ours "
          "from its metrics JSONL when given; '(own JSON)' is its final tokens_per_s, the "
          "mean after step 1); RSS and bound in MiB (peak_rss_mb = ru_maxrss / 1024)")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        p = argparse.ArgumentParser(prog="bench-train-torch.py one")
        argv = sys.argv[2:]
    else:
        p = argparse.ArgumentParser(prog="bench-train-torch.py",
                                    description=__doc__.split("\n\n")[0])
        argv = sys.argv[1:]
    p.add_argument("-c", "--config", required=True)
    p.add_argument("-d", "--data", required=True)
    p.add_argument("-s", "--set", action="append")
    p.add_argument("-n", "--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="stop timing a setting after this many seconds (>= 5 steps)")
    p.add_argument("--tutel", action="store_true",
                   help="the MoE blocks are Tutel's moe_layer (tutel on PYTHONPATH, its CPU "
                        "extension built) instead of the reference's plain PyTorch MoE")
    if p.prog.endswith(" one"):
        p.add_argument("--intra", type=int, default=1)
        p.add_argument("--bf16", action="store_true", help="under torch.autocast(bfloat16)")
        cmd_bench_one(p.parse_args(argv))
    else:
        p.add_argument("--threads", default="1,2")
        p.add_argument("--settings", default="default,passive,blas")
        p.add_argument("--ours", action="append", metavar="THREADS=JSONFILE")
        p.add_argument("--ours-metrics", action="append", metavar="THREADS=JSONL")
        cmd_bench(p.parse_args(argv))


if __name__ == "__main__":
    main()
