#!/usr/bin/env python3
"""tutel_layer.py - an MoE layer saved in Tutel's state-dict names (moe-bench --save,
lib/moe/moe_tutel.h), recomputed independently.

  check FILE...          numpy, float64: from the files of all ranks (one per rank, any order),
                         the full layer is put back together and every rank's
                         moe_bench.output is recomputed from its moe_bench.input with Tutel's
                         semantics (tutel/impls/moe_layer.py, fast_dispatch.py extract_critical,
                         experts/ffn.py): logits = x wg^T, softmax, top-k (ties: lower expert),
                         gates renormalised over the k when k > 1, locations first choices
                         first (in token order, or by top score with BPR), capacity
                         k int(f ceil(T/E)) (f <= 0: the largest count over experts and ranks,
                         f < 0 capped by k int(|f| ceil(T/E))) rounded up to the alignment,
                         y[t] = sum of score * (act(x W1^T + b1) W2 + b2) over kept choices.
                         Passes when every output is within --tol of the largest |y|.
  random LIKE OUT [SEED] a layer of LIKE's shapes with fresh parameters (numpy's generator),
                         in Tutel's names: what another program would hand moe-bench --load.
  same A B               the parameters (Tutel's names) of A and B are bit for bit the same.
  tutel PATTERN          with Tutel importable (PYTHONPATH): Tutel's moe_layer built with the
                         file's sizes, load_state_dict(strict=False), forward on
                         moe_bench.input, compared with moe_bench.output. Under more than one
                         process (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) each reads
                         PATTERN with {rank} put in.
  tutel-init E M H K OUT Tutel's own initial layer (one process, seed 1) in Tutel's names.
  loss FILE B            helloworld.py's loss of the saved output, without the auxiliary
                         term: nll_loss(log_softmax(y.view(B, T/B, M).sum(2), 1), label 0).

Exit status: 0 ok / passed, 1 failed or runtime error, 2 usage error.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import st_read, st_write  # noqa: E402  (file readers only)

PROG = "tutel_layer.py"
PARAMS = ["gates.0.wg.weight", "experts.batched_fc1_w", "experts.batched_fc1_bias",
          "experts.batched_fc2_w", "experts.batched_fc2_bias"]


def die(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def load(path):
    t, meta = st_read(path)
    for n in PARAMS + ["_num_global_experts"]:
        if n not in t:
            die(f"'{path}': no tensor '{n}'")
    return t, meta


def assemble(files):
    """The full layer (wg [E,M], w1 [E,H,M], b1 [E,H], w2 [E,H,M], b2 [E,M]) and each rank's
    (rank, x, y) from the files of all ranks."""
    ranks = []
    for f in files:
        t, meta = load(f)
        ranks.append((int(meta.get("rank", 0)), int(meta.get("world", 1)), f, t, meta))
    ranks.sort(key=lambda r: r[0])
    W = ranks[0][1]
    if sorted(r[0] for r in ranks) != list(range(W)) or any(r[1] != W for r in ranks):
        die(f"the files are not ranks 0..{W - 1} of one world of {W}: "
            + ", ".join(f"{r[2]} (rank {r[0]} of {r[1]})" for r in ranks))
    meta = ranks[0][4]
    E, M, H = int(meta["experts"]), int(meta["model_dim"]), int(meta["hidden_dim"])
    wg = ranks[0][3]["gates.0.wg.weight"].astype(np.float64)
    for q, _, f, t, _ in ranks:
        if not np.array_equal(t["gates.0.wg.weight"], ranks[0][3]["gates.0.wg.weight"]):
            die(f"'{f}': the gate of rank {q} is not rank 0's (it is replicated)")
        if int(t["_num_global_experts"]) != E:
            die(f"'{f}': _num_global_experts {int(t['_num_global_experts'])}, not {E}")
    s = W // E if E < W else 1
    w1 = np.zeros((E, H, M)); b1 = np.zeros((E, H)); w2 = np.zeros((E, H, M))
    b2 = np.zeros((E, M))
    for q, _, _, t, _ in ranks:
        f1, c1 = t["experts.batched_fc1_w"], t["experts.batched_fc1_bias"]
        f2, c2 = t["experts.batched_fc2_w"], t["experts.batched_fc2_bias"]
        if s == 1:  # El whole experts
            El = E // W
            sl = slice(q * El, (q + 1) * El)
            w1[sl], b1[sl], w2[sl], b2[sl] = f1, c1, f2, c2
        else:  # rank q: hidden rows (q % s) H/s.. and b2 columns (q % s) M/s.. of expert q/s
            e, j, Hs, Ms = q // s, q % s, H // s, M // s
            w1[e, j * Hs:(j + 1) * Hs] = f1[0]
            b1[e, j * Hs:(j + 1) * Hs] = c1[0]
            w2[e, j * Hs:(j + 1) * Hs] = f2[0]
            b2[e, j * Ms:(j + 1) * Ms] = c2[0]
    steps = [(q, t["moe_bench.input"].astype(np.float64), t["moe_bench.output"])
             for q, _, _, t, _ in ranks if "moe_bench.input" in t]
    if len(steps) != W:
        die("a file has no moe_bench.input / moe_bench.output (saved without a step)")
    return meta, W, s, (wg, w1, b1, w2, b2), steps


def act(name, h):
    if name == "relu":
        return np.maximum(h, 0.0)
    if name == "gelu":  # tanh form
        return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
    die(f"activation '{name}' is not one this reference knows")


def route(x, wg, k, bpr):
    """Top-k experts [T,k], their scores [T,k], the visiting order of tokens."""
    logits = x @ wg.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
    sc = np.take_along_axis(p, idx, axis=1)
    if k > 1:
        sc = sc / np.maximum(sc.sum(axis=1, keepdims=True), np.finfo(np.float32).eps)
    order = (np.argsort(-p[np.arange(x.shape[0]), idx[:, 0]], kind="stable") if bpr
             else np.arange(x.shape[0]))
    return idx, sc, order


def check(files, tol):
    meta, W, s, (wg, w1, b1, w2, b2), steps = assemble(files)
    E, k = wg.shape[0], int(meta["top_k"])
    f, align = float(meta["capacity_factor"]), int(meta["capacity_alignment"])
    bpr, noise = int(meta["batch_prioritized_routing"]), float(meta["gate_noise"])
    if noise != 0.0:
        die(f"'{files[0]}': gate noise {noise}: its draws are the C library's, not "
            "reproduced here (save a layer without --gate-noise)")
    align = align * s // math.gcd(align, s)
    routed = [(q, x, y) + route(x, wg, k, bpr) for q, x, y in steps]
    nmax = max(np.bincount(idx.ravel(), minlength=E).max() for _, _, _, idx, _, _ in routed)
    worst = 0.0
    for q, x, y, idx, sc, order in routed:
        T = x.shape[0]
        per = (T + E - 1) // E
        C = k * int(f * per) if f > 0 else (int(nmax) if f == 0 else
                                            min(int(nmax), k * int(-f * per)))
        C = (C + align - 1) // align * align
        out = np.zeros_like(x)
        count = np.zeros(E, dtype=np.int64)
        kept = 0
        for r in range(k):
            for t in order:
                e = idx[t, r]
                loc = count[e]
                count[e] += 1
                if loc >= C:
                    continue
                kept += 1
                h = act(meta["activation"], x[t] @ w1[e].T + b1[e])
                out[t] += sc[t, r] * (h @ w2[e] + b2[e])
        scale = max(float(np.abs(out).max()), 1e-30)
        err = float(np.abs(out - y.astype(np.float64)).max()) / scale
        worst = max(worst, err)
        print(f"rank {q}: T {T}, C {C}, {k * T - kept} choices dropped; largest difference "
              f"{err:.2e} of max |y| {scale:.4g}")
    print(f"{'ok' if worst <= tol else 'FAIL'}: {len(steps)} rank(s), E {E}, k {k}, "
          f"capacity factor {f:g}, worst {worst:.2e} (tolerance {tol:g})")
    return worst <= tol


def random_like(like, out, seed):
    t, meta = load(like)
    g = np.random.default_rng(seed)
    res = {n: (g.standard_normal(t[n].shape) / math.sqrt(t[n].shape[-1])).astype(np.float32)
           for n in PARAMS}
    res["_num_global_experts"] = t["_num_global_experts"]
    st_write(out, res, {"format": "tutel-moe-layer", "written_by": PROG})


def same(a, b):
    ta, _ = load(a)
    tb, _ = load(b)
    bad = [n for n in PARAMS + ["_num_global_experts"]
           if ta[n].shape != tb[n].shape or ta[n].dtype != tb[n].dtype
           or ta[n].tobytes() != tb[n].tobytes()]
    for n in bad:
        print(f"FAIL: '{n}' differs ({ta[n].shape} {ta[n].dtype} / {tb[n].shape} "
              f"{tb[n].dtype})")
    if not bad:
        print(f"ok: the {len(PARAMS) + 1} tensors of '{a}' and '{b}' are the same")
    return not bad


def tutel_layer(E_local, M, H, k, f, act_name, bpr, align_over):
    import torch
    import torch.nn.functional as F
    from tutel import moe as tutel_moe, system
    env = system.init_data_model_parallel(backend="gloo")
    fn = (lambda x: F.relu(x)) if act_name == "relu" else (lambda x: F.gelu(x, approximate="tanh"))
    layer = tutel_moe.moe_layer(
        gate_type={"type": "top", "k": k, "capacity_factor": f, "fp32_gate": True},
        experts={"type": "ffn", "num_experts_per_device": E_local, "hidden_size_per_expert": H,
                 "activation_fn": fn},
        model_dim=M, seeds=(1, env.global_rank + 1, 1), batch_prioritized_routing=bool(bpr),
        a2a_ffn_overlap_degree=align_over)
    return torch, env, layer


def tutel_check(pattern, tol):
    q = int(os.environ.get("RANK", "0"))
    path = pattern.replace("{rank}", str(q)).replace("{size}", os.environ.get("WORLD_SIZE", "1"))
    t, meta = load(path)
    W, E = int(meta["world"]), int(meta["experts"])
    M, H, k = int(meta["model_dim"]), int(meta["hidden_dim"]), int(meta["top_k"])
    if float(meta["gate_noise"]) != 0.0:
        die(f"'{path}': gate noise is drawn differently in Tutel")
    s = W // E if E < W else 1
    align = int(meta["capacity_alignment"])  # Tutel aligns to s * a2a_ffn_overlap_degree
    align = align * s // math.gcd(align, s)     # moe_dist.h: to lcm(alignment, s)
    torch, env, layer = tutel_layer(E // W if E >= W else -(W // E), M, H, k,
                                    float(meta["capacity_factor"]), meta["activation"],
                                    int(meta["batch_prioritized_routing"]), align // s)
    if env.global_size != W:
        die(f"'{path}' was saved by {W} rank(s); this is {env.global_size}")
    sd = {n: torch.from_numpy(t[n]) for n in PARAMS}
    sd["_num_global_experts"] = torch.from_numpy(np.asarray(t["_num_global_experts"]))
    missing, unexpected = layer.load_state_dict(sd, strict=False)
    if missing or unexpected:
        die(f"'{path}': Tutel's layer misses {missing}, does not know {unexpected}")
    layer.eval()
    x = torch.from_numpy(t["moe_bench.input"]).unsqueeze(0)
    with torch.no_grad():
        y = layer(x).squeeze(0).numpy().astype(np.float64)
    ref = t["moe_bench.output"].astype(np.float64)
    scale = max(float(np.abs(y).max()), 1e-30)
    err = float(np.abs(y - ref).max()) / scale
    print(f"{'ok' if err <= tol else 'FAIL'}: rank {q} of {W}, Tutel's moe_layer on "
          f"'{path}': largest difference {err:.2e} of max |y| {scale:.4g} (tolerance {tol:g})")
    return err <= tol


def tutel_init(E, M, H, k, out):
    torch, env, layer = tutel_layer(E, M, H, k, 1.0, "relu", 0, 1)
    sd = layer.state_dict()
    res = {n: sd[n].numpy().astype(np.float32) for n in PARAMS}
    res["_num_global_experts"] = np.asarray(int(sd["_num_global_experts"]), dtype=np.int64)
    st_write(out, res, {"format": "tutel-moe-layer", "written_by": "Tutel " + PROG})


def helloworld_loss(path, B):
    t, _ = load(path)
    y = t["moe_bench.output"].astype(np.float64)
    s = y.reshape(B, -1, y.shape[1]).sum(axis=2)
    mx = s.max(axis=1, keepdims=True)
    logp = s - mx - np.log(np.exp(s - mx).sum(axis=1, keepdims=True))
    print(f"{-logp[:, 0].mean():.9g}")


def main(argv):
    tol = 1e-5
    if argv and argv[0].startswith("--tol="):
        tol = float(argv.pop(0)[6:])
    if not argv:
        die("usage: tutel_layer.py [--tol=X] check FILE... | random LIKE OUT [SEED] | same A B "
            "| tutel PATTERN | tutel-init E M H K OUT | loss FILE B", 2)
    cmd, rest = argv[0], argv[1:]
    if cmd == "check" and rest:
        return 0 if check(rest, tol) else 1
    if cmd == "random" and len(rest) in (2, 3):
        random_like(rest[0], rest[1], int(rest[2]) if len(rest) == 3 else 1)
        return 0
    if cmd == "same" and len(rest) == 2:
        return 0 if same(*rest) else 1
    if cmd == "tutel" and len(rest) == 1:
        return 0 if tutel_check(rest[0], tol) else 1
    if cmd == "loss" and len(rest) == 2:
        helloworld_loss(rest[0], int(rest[1]))
        return 0
    if cmd == "tutel-init" and len(rest) == 5:
        tutel_init(*(int(v) for v in rest[:4]), rest[4])
        return 0
    die(f"unknown command or wrong arguments: {' '.join(argv)}", 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
