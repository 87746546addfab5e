#!/usr/bin/python3
"""route_torch.py - an independent PyTorch reference for dpc-route (test/ref, not shipped).

Written from the contracts of lib/route/lm.h, route.h and routefile.h, not from their code, so
that dpc-route's features, scores and evaluation can be checked against it. Everything is
recomputed in float64 from the checkpoints and the token file:

  forward: GPT-2 as test/ref/gpt2_torch.py describes it (pre-LN blocks, eps 1e-5, tanh GELU,
    Conv1D y = x W + b, untied lm_head), here returning every block's output too.
  windows (lm.h): a document of n tokens runs in consecutive windows of S = seq_len tokens,
    window w holding tokens [w S, min((w + 1) S, n)). Token j >= 1 is predicted from tokens
    [floor((j - 1) / S) S, j) (the output at position j - 1 of window floor((j - 1) / S), so
    the first token of a window is predicted from the whole previous window); token 0 gets
    log p = 0. The hidden state of position j sees tokens [floor(j / S) S, j].
  features (lm.h, route.h): the mean of block L's output (the residual stream after block L;
    for the last block before ln_f) over the first min(N, n) tokens; zeros for an empty
    document.
  scores (routefile.h): "logprob" [tokens, paths] as above, "doc_logprob" [docs, paths] the
    sum of logprob over positions j >= N.
  routers (routefile.h): kmeans: the nearest centroid (squared Euclidean distance); logreg
    and window: the largest weight . ((x - mean) / std) + bias + correction; ties go to the
    lower index.
  evaluation (route.h): with N the document router's prefix, the tokens j >= N of each
    document, in windows of W: window 0 = [N, N + W) goes to the document router's path;
    window m >= 1 = [N + m W, N + (m + 1) W) to the window router's path for the features at
    b = N + m W: concat(mean of base block-L outputs over [max(0, b - context), b), mean over
    [0, b)). Each token is scored with the log p of the path its window went to (lm.h's
    windows: a switch recomputes the context on the new path). loss = -sum / tokens. The mode
    with "window": 0 routes once per document (one window of infinite W).

Subcommands (run with /usr/bin/python3, which has torch and numpy):
  features CKPT TOK --prefix N --layer L --out F.npy
                                      prefix features, float64 [docs, C]
  compare-features OURS.st CKPT TOK [--prefix N] [--layer L]
                                      dpc-route features' output against a recomputation:
                                      max|a-b| / max|b| <= 1e-5
  compare-scores OURS.st TOK CKPT... [--prefix N]
                                      dpc-route score's output: logprob elementwise
                                      |a-b| <= 1e-4 + 1e-5 |b|, doc_logprob elementwise
                                      |a-b| <= 1e-5 |b| (+ 1e-6 for documents with nothing
                                      past the prefix)
  compare-eval OURS.json TOK BASE ROUTER [WROUTER...] --path CKPT...
                                      dpc-route eval --json's output: every mode's token
                                      count and switch count equal, loss within 1e-5
                                      relative, from this file's own features, routing and
                                      log-probs
  selftest                            checks of this file that need no C program
--prefix/--layer given to a compare are what the file must have been made with (its
metadata is checked against them); without them the file's own recipe is recomputed.
Exit status: 0 ok / comparison passed, 1 comparison failed or runtime error, 2 usage error.
"""
import argparse
import json
import math
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch as g2  # noqa: E402  (st_read, st_write, read_tokfile, param_shapes, ...)

PROG = "route_torch.py"
FEAT_RTOL = 1e-5
LP_ATOL, LP_RTOL = 1e-4, 1e-5
DOC_RTOL, DOC_ATOL = 1e-5, 1e-6
EVAL_RTOL = 1e-5
NEAR_TIE = 1e-4  # routing margins below this (float64) are printed: float32 may flip them


def die(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


# ---- token files, with the document offsets ------------------------------------------------
read_tokfile = g2.read_tokfile


def write_tokfile(path, docs, vocab):
    """A DPCTOKS file of the given documents (lists of ints), empty metadata ("{}" each)."""
    toks = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs] + [np.zeros(0, np.int64)])
    width = 2 if vocab <= 65536 else 4
    tb = toks.astype("<u2" if width == 2 else "<u4").tobytes()
    tb += b"\0" * (-len(tb) % 8)
    offs = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype("<u8")
    meta = b"{}" * len(docs)
    moffs = (np.arange(len(docs) + 1) * 2).astype("<u8")
    body = tb + offs.tobytes() + moffs.tobytes() + meta
    head = b"DPCTOKS\0" + struct.pack("<IIQQIIQ", 1, vocab, len(docs), len(toks), width,
                                      zlib.crc32(body), len(meta)) + b"\0" * 12
    head += struct.pack("<I", zlib.crc32(head))
    with open(path, "wb") as f:
        f.write(head + body)


# ---- checkpoints and the model -------------------------------------------------------------
def load_model(path):
    """(parameters as float64 torch tensors by HF name, model sizes) of a checkpoint: only the
    parameters are needed (no optimizer state), so module-assembled paths work too."""
    import torch
    t, meta = g2.st_read(path)
    try:
        m = {k: int(meta[k]) for k in g2.MODEL_KEYS}
        if "n_out" in meta:
            m["n_out"] = int(meta["n_out"])
    except (KeyError, ValueError) as e:
        die(f"cannot read '{path}': metadata lacks model size {e}")
    P = {}
    for n, shape in g2.param_shapes(m):
        if n not in t:
            die(f"cannot read '{path}': no tensor '{n}'")
        if tuple(t[n].shape) != shape:
            die(f"cannot read '{path}': '{n}' has shape {list(t[n].shape)}, expected "
                f"{list(shape)}")
        P[n] = torch.tensor(t[n].astype(np.float64))
    return P, m


def forward(P, idx, m):
    """idx [B, T] (T <= seq_len) -> (list of block outputs [B, T, C], log-softmax [B, T, V])."""
    import torch
    import torch.nn.functional as F
    B, T = idx.shape
    C, NH, L = m["n_embd"], m["n_head"], m["n_layer"]
    hs = C // NH

    def lin(x, w, b):
        return x @ w + b

    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    outs = []
    for i in range(L):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        q, k, v = lin(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"]).split(C, -1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        h = F.gelu(lin(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + lin(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
        outs.append(x)
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    return outs, (x @ P["lm_head.weight"].t()).log_softmax(-1)


def run_corpus(P, m, toks, offs, layers=(), logprob=True, batch=256):
    """Every document in its windows of seq_len: ({layer: hidden [ntokens, C]} for the layers
    asked, logprob [ntokens] (0 at each document's first token) or None)."""
    import torch
    S, C = m["seq_len"], m["n_embd"]
    for L in layers:
        if not 0 <= L < m["n_layer"]:
            die(f"layer {L} out of range: the model has {m['n_layer']} blocks", 2)
    if toks.size and int(toks.max()) >= m["vocab_size"]:
        die(f"token {int(toks.max())} >= the model's vocab {m['vocab_size']}")
    n_all = len(toks)
    hid = {L: np.zeros((n_all, C)) for L in layers}
    lp = np.zeros(n_all) if logprob else None
    wins = {}  # length -> list of (global start, predicts the token after the window)
    for d in range(len(offs) - 1):
        s0, n = int(offs[d]), int(offs[d + 1] - offs[d])
        for w0 in range(0, n, S):
            l = min(S, n - w0)
            wins.setdefault(l, []).append((s0 + w0, w0 + l < n))
    with torch.no_grad():
        for l, ws in sorted(wins.items()):
            for i in range(0, len(ws), batch):
                chunk = ws[i:i + batch]
                starts = np.array([s for s, _ in chunk])
                pos = starts[:, None] + np.arange(l)[None, :]
                outs, logp = forward(P, torch.from_numpy(toks[pos]), m)
                for L in layers:
                    hid[L][pos.ravel()] = outs[L].reshape(-1, C).numpy()
                if logprob:
                    logp = logp.numpy()
                    for b, (s, more) in enumerate(chunk):
                        k = l if more else l - 1  # outputs that predict a token of the doc
                        lp[s + 1:s + 1 + k] = logp[b, np.arange(k), toks[s + 1:s + 1 + k]]
    return hid, lp


def prefix_means(hidden, offs, prefix):
    """[docs, C]: mean of hidden over each document's first min(prefix, n) tokens."""
    out = np.zeros((len(offs) - 1, hidden.shape[1]))
    for d in range(len(offs) - 1):
        k = min(prefix, int(offs[d + 1] - offs[d]))
        if k:
            out[d] = hidden[offs[d]:offs[d] + k].mean(0)
    return out


def features(ckpt, toks, offs, prefix, layer):
    P, m = load_model(ckpt)
    if not 1 <= prefix <= m["seq_len"]:
        die(f"--prefix {prefix}: must be 1 .. the model's seq_len {m['seq_len']}", 2)
    hid, _ = run_corpus(P, m, toks, offs, layers=(layer,), logprob=False)
    return prefix_means(hid[layer], offs, prefix)


def scores(ckpts, toks, offs, prefix):
    """(logprob [tokens, paths], doc_logprob [docs, paths])."""
    lps = []
    for c in ckpts:
        P, m = load_model(c)
        lps.append(run_corpus(P, m, toks, offs, logprob=True)[1])
    lp = np.stack(lps, 1) if lps else np.zeros((len(toks), 0))
    doc = np.zeros((len(offs) - 1, lp.shape[1]))
    for d in range(len(offs) - 1):
        s0, e = int(offs[d]), int(offs[d + 1])
        doc[d] = lp[s0 + min(prefix, e - s0):e].sum(0)
    return lp, doc


# ---- routers -------------------------------------------------------------------------------
class Router:
    """A dpc-router file (routefile.h), in float64."""

    def __init__(self, path):
        t, meta = g2.st_read(path)
        self.path, self.meta = path, meta
        if meta.get("format") != "dpc-router":
            die(f"'{path}': format '{meta.get('format')}', not 'dpc-router'")
        self.kind = meta.get("kind")
        try:
            self.paths, self.dim = int(meta["paths"]), int(meta["dim"])
            self.layer, self.prefix = int(meta["layer"]), int(meta["prefix"])
            if self.kind == "window":
                self.window, self.context = int(meta["window"]), int(meta["context"])
        except (KeyError, ValueError) as e:
            die(f"'{path}': metadata lacks or mangles {e}")
        need = {"kmeans": {"centroids": (self.paths, self.dim)}}.get(
            self.kind, {"mean": (self.dim,), "std": (self.dim,), "weight": (self.paths, self.dim),
                        "bias": (self.paths,), "correction": (self.paths,)})
        if self.kind not in ("kmeans", "logreg", "window"):
            die(f"'{path}': unknown router kind '{self.kind}'")
        for n, shape in need.items():
            if n not in t or tuple(t[n].shape) != shape:
                die(f"'{path}': tensor '{n}' missing or not of shape {list(shape)}")
            setattr(self, n, t[n].astype(np.float64))

    def scores(self, x):
        """Per path, the larger the better (kmeans: minus the squared distance)."""
        if self.kind == "kmeans":
            return -((x[None, :] - self.centroids) ** 2).sum(1)
        return self.weight @ ((x - self.mean) / self.std) + self.bias + self.correction

    def route(self, x):
        """(the best path, lower index on ties; the margin to the runner-up)."""
        s = self.scores(x)
        best = int(np.argmax(s))  # the first of equal maxima
        rest = np.delete(s, best)
        return best, float(s[best] - rest.max()) if rest.size else math.inf


class TransformerRouter:
    """A transformer window router (lib/route/wrouter.h): a dpc-checkpoint whose head is over
    the paths; at boundary a it reads the (at most seq_len) tokens before a and routes the
    window after a to the argmax of its output at position a - 1."""

    def __init__(self, path):
        _, meta = g2.st_read(path)
        if meta.get("format") != "dpc-checkpoint" or meta.get("router") != "transformer":
            die(f"'{path}': not a transformer window router")
        self.path, self.meta, self.kind = path, meta, "transformer"
        try:
            self.paths, self.window = int(meta["n_out"]), int(meta["window"])
            self.prefix = int(meta["prefix"])
        except (KeyError, ValueError) as e:
            die(f"'{path}': metadata lacks or mangles {e}")
        self.P, self.m = load_model(path)

    def route_at(self, doc, a):
        """(path, margin) for the window starting at a of the document's tokens doc."""
        import torch
        ctx = doc[max(0, a - self.m["seq_len"]):a]
        with torch.no_grad():
            _, logp = forward(self.P, torch.from_numpy(ctx[None, :].astype(np.int64)), self.m)
        s = logp[0, -1].numpy()
        best = int(np.argmax(s))
        rest = np.delete(s, best)
        return best, float(s[best] - rest.max()) if rest.size else math.inf


def open_window_router(path):
    _, meta = g2.st_read(path)
    return TransformerRouter(path) if meta.get("router") == "transformer" else Router(path)


def window_spans(n, prefix, W):
    """[(start, end)] of the windows over [prefix, n): [prefix + m W, prefix + (m + 1) W)."""
    return [(b, min(b + W, n)) for b in range(prefix, n, W)] if W else \
        ([(prefix, n)] if n > prefix else [])


def evaluate(tok_path, base, doc_router, wrouters, ckpts):
    """Every mode of dpc-route eval: [{window, tokens, nll, loss, switches}], and the routing
    decisions' smallest margins."""
    toks, offs, _ = read_tokfile(tok_path)
    R = Router(doc_router)
    WR = [open_window_router(w) for w in wrouters]
    if R.kind not in ("kmeans", "logreg"):
        die(f"'{doc_router}' is a {R.kind} router, not a document router")
    for w in WR:
        if w.kind not in ("window", "transformer"):
            die(f"'{w.path}' is a {w.kind} router, not a window router")
        if w.prefix != R.prefix:
            die(f"'{w.path}' has windows from token {w.prefix}, the document router's "
                f"prefix is {R.prefix}")
    for r in [R] + WR:
        if r.paths != len(ckpts):
            die(f"'{r.path}' routes to {r.paths} paths, {len(ckpts)} given")
    N = R.prefix
    P, m = load_model(base)
    C = m["n_embd"]
    LR = [w for w in WR if w.kind == "window"]
    if R.dim != C or any(w.dim != 2 * C for w in LR):
        die(f"router dimensions {[R.dim] + [w.dim for w in LR]} do not fit the base's C = {C}")
    layers = sorted({R.layer} | {w.layer for w in LR})
    hid, _ = run_corpus(P, m, toks, offs, layers=layers, logprob=False)
    lp, _ = scores(ckpts, toks, offs, N)
    feats = prefix_means(hid[R.layer], offs, N)
    ndocs = len(offs) - 1
    choice, margins = [], []
    for d in range(ndocs):
        p, mg = R.route(feats[d])
        choice.append(p)
        if offs[d + 1] - offs[d] > N:  # only documents with a scored token count
            margins.append((mg, d, 0))
    modes = []
    for w in [None] + WR:
        W = w.window if w else 0
        nll, tokens, switches, wm = 0.0, 0, 0, []
        for d in range(ndocs):
            s0, n = int(offs[d]), int(offs[d + 1] - offs[d])
            h = hid[w.layer][s0:s0 + n] if w and w.kind == "window" else None
            prev = None
            for k, (a, e) in enumerate(window_spans(n, N, W)):
                if k == 0:
                    p = choice[d]
                elif w.kind == "transformer":
                    p, mg = w.route_at(toks[s0:s0 + n], a)
                    wm.append((mg, d, a))
                else:
                    x = np.concatenate([h[max(0, a - w.context):a].mean(0), h[:a].mean(0)])
                    p, mg = w.route(x)
                    wm.append((mg, d, a))
                switches += prev is not None and p != prev
                prev = p
                nll -= lp[s0 + a:s0 + e, p].sum()
                tokens += e - a
        modes.append({"window": W, "tokens": tokens, "nll": nll,
                      "loss": nll / tokens if tokens else math.nan, "switches": switches,
                      "min_margin": min(margins + wm, default=(math.inf, -1, -1))})
    return modes, {"docs": ndocs, "paths": len(ckpts), "prefix": N}


# ---- comparisons ---------------------------------------------------------------------------
def check_meta(meta, path, want):
    """Messages for metadata keys of path that differ from want (values compared as text)."""
    bad = []
    for k, v in want.items():
        if v is not None and str(meta.get(k)) != str(v):
            bad.append(f"'{path}': metadata {k} = {meta.get(k)!r}, expected {v!r}")
    return bad


def read_ours(path, fmt, names):
    t, meta = g2.st_read(path)
    if meta.get("format") != fmt:
        die(f"'{path}': format '{meta.get('format')}', not '{fmt}'")
    for n in names:
        if n not in t:
            die(f"'{path}': no tensor '{n}'")
    return t, meta


def cmd_features(a):
    toks, offs, _ = read_tokfile(a.tok)
    np.save(a.out, features(a.ckpt, toks, offs, a.prefix, a.layer))


def cmd_compare_features(a):
    t, meta = read_ours(a.ours, "dpc-features", ["features"])
    toks, offs, crc = read_tokfile(a.tok)
    try:
        prefix = a.prefix if a.prefix is not None else int(meta["prefix"])
        layer = a.layer if a.layer is not None else int(meta["layer"])
    except (KeyError, ValueError) as e:
        die(f"'{a.ours}': metadata lacks {e} (give --prefix and --layer)")
    bad = check_meta(meta, a.ours, {"prefix": prefix, "layer": layer, "docs": len(offs) - 1,
                                    "corpus_crc": f"{crc:08x}"})
    ref = features(a.ckpt, toks, offs, prefix, layer)
    ours = t["features"].astype(np.float64)
    print(f"features: {ref.shape[0]} documents x {ref.shape[1]}, block {layer}, prefix {prefix}")
    if ours.shape != ref.shape:
        bad.append(f"'{a.ours}': features have shape {list(ours.shape)}, expected "
                   f"{list(ref.shape)}")
    else:
        diff = np.abs(ours - ref)
        scale = np.abs(ref).max()
        rel = diff.max() / scale if scale > 0 else diff.max()
        d, c = np.unravel_index(np.argmax(diff), diff.shape)
        print(f"  max|ours - ref| / max|ref| = {rel:.3e} (limit {FEAT_RTOL:g}); worst document "
              f"{d} (length {offs[d + 1] - offs[d]}) element {c}: ours {ours[d, c]:.9g} ref "
              f"{ref[d, c]:.9g}")
        if not rel <= FEAT_RTOL:
            rows = np.nonzero(diff.max(1) > FEAT_RTOL * scale)[0]
            bad.append(f"features differ: {len(rows)} of {len(rows) and ref.shape[0]} "
                       f"documents over the limit (first {rows[:8].tolist()})")
    for b in bad:
        print(f"  FAIL: {b}")
    print(f"compare-features {a.ours}: {'FAIL' if bad else 'PASS'}")
    sys.exit(1 if bad else 0)


def cmd_compare_scores(a):
    t, meta = read_ours(a.ours, "dpc-scores", ["logprob", "doc_logprob"])
    toks, offs, crc = read_tokfile(a.tok)
    try:
        prefix = a.prefix if a.prefix is not None else int(meta["prefix"])
    except (KeyError, ValueError) as e:
        die(f"'{a.ours}': metadata lacks {e} (give --prefix)")
    ndocs = len(offs) - 1
    bad = check_meta(meta, a.ours, {"prefix": prefix, "docs": ndocs, "tokens": len(toks),
                                    "paths": len(a.ckpts), "corpus_crc": f"{crc:08x}"})
    lp, doc = scores(a.ckpts, toks, offs, prefix)
    print(f"scores: {ndocs} documents, {len(toks)} tokens, {len(a.ckpts)} paths, prefix {prefix}")
    docof = np.searchsorted(offs, np.arange(len(toks)), side="right") - 1
    for name, ref, atol, rtol in (("logprob", lp, LP_ATOL, LP_RTOL),
                                  ("doc_logprob", doc, DOC_ATOL, DOC_RTOL)):
        ours = t[name].astype(np.float64)
        if ours.shape != ref.shape:
            bad.append(f"'{a.ours}': {name} has shape {list(ours.shape)}, expected "
                       f"{list(ref.shape)}")
            continue
        diff = np.abs(ours - ref)
        ratio = diff / (atol + rtol * np.abs(ref))
        i, p = np.unravel_index(np.argmax(ratio), ratio.shape) if ratio.size else (0, 0)
        if name == "logprob":
            d = docof[i] if ratio.size else 0
            where = f"token {i} (document {d}, position {i - offs[d]}) path {p}"
        else:
            d = i
            where = f"document {i} (length {offs[i + 1] - offs[i]}) path {p}"
        nbad = int((ratio > 1).sum())
        print(f"  {name}: max |ours - ref| {diff.max(initial=0):.3e}, max relative "
              f"{(diff / np.maximum(np.abs(ref), 1e-30)).max(initial=0):.3e}; worst "
              f"|a-b|/({atol:g} + {rtol:g}|b|) = {ratio.max(initial=0):.3g} at {where}"
              + (f": ours {ours[i, p]:.9g} ref {ref[i, p]:.9g}" if ratio.size else ""))
        if nbad:
            bad.append(f"{name} differs at {nbad} entries (worst at {where})")
    for b in bad:
        print(f"  FAIL: {b}")
    print(f"compare-scores {a.ours}: {'FAIL' if bad else 'PASS'}")
    sys.exit(1 if bad else 0)


def cmd_compare_eval(a):
    try:
        with open(a.ours) as f:
            ours = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"cannot read '{a.ours}': {e}")
    modes, info = evaluate(a.tok, a.base, a.router, a.wrouters, a.paths)
    bad = []
    for k, v in info.items():
        if ours.get(k) != v:
            bad.append(f"'{a.ours}': {k} = {ours.get(k)!r}, expected {v!r}")
    om = ours.get("modes", [])
    if len(om) != len(modes):
        bad.append(f"'{a.ours}': {len(om)} modes, expected {len(modes)} (the document router "
                   f"and {len(a.wrouters)} window routers)")
    for o, r in zip(om, modes):
        name = f"window {r['window']}" if r["window"] else "once per document"
        mg, d, b = r["min_margin"]
        print(f"  {name}: ours loss {o.get('loss')} over {o.get('tokens')} tokens, "
              f"{o.get('switches')} switches; ref loss {r['loss']:.9g} over {r['tokens']} "
              f"tokens, {r['switches']} switches"
              + (f" (smallest routing margin {mg:.3g}, document {d} at {b})" if d >= 0 else ""))
        if o.get("window") != r["window"]:
            bad.append(f"{name}: ours has window {o.get('window')} in this place")
            continue
        if o.get("tokens") != r["tokens"]:
            bad.append(f"{name}: {o.get('tokens')} tokens, expected {r['tokens']} (the windows "
                       f"from the prefix, or the prefix, differ)")
        lo = o.get("loss")
        rel = abs(lo - r["loss"]) / abs(r["loss"]) if isinstance(lo, (int, float)) else math.inf
        print(f"    loss relative difference {rel:.3e} (limit {EVAL_RTOL:g})")
        if not rel <= EVAL_RTOL:
            bad.append(f"{name}: loss {lo} differs from {r['loss']:.9g} (relative {rel:.3e})"
                       + (f"; a routing decision was a near tie (margin {mg:.3g}, document "
                          f"{d} at {b})" if mg < NEAR_TIE else ""))
        if "switches" in o and o["switches"] != r["switches"]:
            bad.append(f"{name}: {o['switches']} switches, expected {r['switches']} (routing "
                       f"decisions differ)")
    for b in bad:
        print(f"  FAIL: {b}")
    print(f"compare-eval {a.ours}: {'FAIL' if bad else 'PASS'}")
    sys.exit(1 if bad else 0)


# ---- self-test -----------------------------------------------------------------------------
def cmd_selftest(a):
    """Checks that need no C program: the forward against gpt2_torch.py's (per-token losses),
    the batched windows against one forward per token over exactly the context lm.h names,
    the prefix means, the routers' rules and ties, the window arithmetic, and compare-features
    passing on its own output and failing on another layer's."""
    import subprocess
    import tempfile
    import torch
    ok = True

    def check(good, what):
        nonlocal ok
        ok &= bool(good)
        print(f"{'ok  ' if good else 'FAIL'} {what}")

    rng = np.random.default_rng(0)
    m = {"n_layer": 2, "n_embd": 16, "n_head": 4, "seq_len": 8, "vocab_size": 11}
    P32 = {k: (v + rng.standard_normal(v.shape) * 0.3).astype(np.float32)
           for k, v in g2.init_params(m, 7).items()}
    P = {k: torch.tensor(v.astype(np.float64)) for k, v in P32.items()}
    x = rng.integers(0, 11, (3, 8))
    y = rng.integers(0, 11, (3, 8))
    _, logp = forward(P, torch.from_numpy(x), m)
    mine = -logp.gather(-1, torch.from_numpy(y)[..., None])[..., 0].numpy().ravel()
    _, theirs = g2.forward(g2.to_torch(P32, torch.float64), torch.from_numpy(x),
                           torch.from_numpy(y), m)
    err = float(np.abs(mine - theirs.numpy()).max())
    check(err <= 1e-10, f"forward against gpt2_torch.forward: max |diff| {err:.3e}")

    S = m["seq_len"]
    lens = [0, 1, 2, 5, 7, 8, 9, 15, 16, 17, 30]
    docs = [rng.integers(0, 11, n).tolist() for n in lens]
    toks = np.array(sum(docs, []), dtype=np.int64)
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    hid, lp = run_corpus(P, m, toks, offs, layers=(0, 1), logprob=True, batch=3)
    e_lp = e_h = 0.0
    with torch.no_grad():
        for d, doc in enumerate(docs):
            doc = np.array(doc, dtype=np.int64)
            for j in range(len(doc)):
                s0 = offs[d] + j
                if j == 0:
                    e_lp = max(e_lp, abs(lp[s0]))
                else:
                    c0 = (j - 1) // S * S  # lm.h: context [floor((j-1)/S) S, j)
                    _, lg = forward(P, torch.from_numpy(doc[None, c0:j]), m)
                    e_lp = max(e_lp, abs(lp[s0] - float(lg[0, -1, doc[j]])))
                c0 = j // S * S  # hidden state of j sees [floor(j/S) S, j]
                outs, _ = forward(P, torch.from_numpy(doc[None, c0:j + 1]), m)
                for L in (0, 1):
                    e_h = max(e_h, float(np.abs(hid[L][s0] - outs[L][0, -1].numpy()).max()))
    check(e_lp <= 1e-10, f"windowed log-probs against one forward per token over "
          f"[floor((j-1)/S) S, j), lengths {lens}: max |diff| {e_lp:.3e}")
    check(e_h <= 1e-10, f"windowed hidden states against one forward per position over "
          f"[floor(j/S) S, j]: max |diff| {e_h:.3e}")
    f = prefix_means(hid[1], offs, 6)
    want = np.stack([hid[1][offs[d]:offs[d] + min(6, n)].mean(0) if n else np.zeros(16)
                     for d, n in enumerate(lens)])
    check(np.abs(f - want).max() <= 1e-12 and not f[0].any(),
          "prefix means over min(prefix, length) tokens, zeros for an empty document")

    check(window_spans(20, 4, 5) == [(4, 9), (9, 14), (14, 19), (19, 20)]
          and window_spans(4, 4, 5) == [] and window_spans(3, 4, 5) == []
          and window_spans(20, 4, 0) == [(4, 20)], "window spans from the prefix")

    r = Router.__new__(Router)
    r.kind, r.centroids = "kmeans", np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    got = [r.route(np.array(v))[0] for v in ([0.1, 0.1], [1.9, 0], [0.2, 1.5], [1.0, 0.0])]
    check(got == [0, 1, 2, 0], f"kmeans: nearest centroid, tie to the lower index ({got})")
    r.kind, r.mean, r.std = "logreg", np.array([1.0, -1.0]), np.array([2.0, 0.5])
    r.weight = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    r.bias, r.correction = np.array([0.0, 0.5, 0.0]), np.array([0.0, -0.5, 1.0])
    # x = (3, -1): z = (1, 0); scores 1, 0, 0  -> 0;  x = (1, 0): z = (0, 2); scores 0, 2, 1 -> 1
    # x = (-1, -1): z = (-1, 0); scores -1, 0, 2 -> 2;  x = (1, -1 + 0.5): 0, 1, 1 -> 1 (tie)
    got = [r.route(np.array(v))[0] for v in ([3.0, -1.0], [1.0, 0.0], [-1.0, -1.0],
                                              [1.0, -0.5])]
    check(got == [0, 1, 2, 1], f"logreg: argmax of weight.(x-mean)/std + bias + correction, "
          f"tie to the lower index ({got})")

    with tempfile.TemporaryDirectory() as d:
        tp, ck = os.path.join(d, "t.tok"), os.path.join(d, "c.safetensors")
        write_tokfile(tp, docs, 11)
        t2, o2, crc = read_tokfile(tp)
        check(np.array_equal(t2, toks) and np.array_equal(o2, offs),
              "token file round trip with offsets")
        g2.write_ckpt(ck, P32, {k: np.zeros_like(v) for k, v in P32.items()},
                      {k: np.zeros_like(v) for k, v in P32.items()}, 0, m)
        fe = features(ck, toks, offs, 6, 1).astype(np.float32)
        fp = os.path.join(d, "f.safetensors")
        g2.st_write(fp, {"features": fe}, {"format": "dpc-features", "layer": 1, "prefix": 6,
                                           "docs": len(docs), "corpus_crc": f"{crc:08x}"})
        me = [sys.executable, os.path.abspath(__file__)]
        r1 = subprocess.run(me + ["compare-features", fp, ck, tp, "--layer", "1", "--prefix",
                                  "6"], capture_output=True, text=True)
        r2 = subprocess.run(me + ["compare-features", fp, ck, tp, "--layer", "0", "--prefix",
                                  "6"], capture_output=True, text=True)
        check(r1.returncode == 0 and r2.returncode == 1 and "features differ" in r2.stdout,
              f"compare-features passes its own float32 features and fails them as layer 0 "
              f"(exit {r1.returncode}, {r2.returncode})")
    print(f"selftest: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


# ---- command line --------------------------------------------------------------------------
def main():
    parsers = {}

    def add(name):
        parsers[name] = argparse.ArgumentParser(prog=f"{PROG} {name}")
        return parsers[name]

    p = add("features")
    p.add_argument("ckpt")
    p.add_argument("tok")
    p.add_argument("--prefix", type=int, required=True)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--out", required=True)

    p = add("compare-features")
    p.add_argument("ours")
    p.add_argument("ckpt")
    p.add_argument("tok")
    p.add_argument("--prefix", type=int)
    p.add_argument("--layer", type=int)

    p = add("compare-scores")
    p.add_argument("ours")
    p.add_argument("tok")
    p.add_argument("ckpts", nargs="+")
    p.add_argument("--prefix", type=int)

    p = add("compare-eval")
    p.add_argument("ours")
    p.add_argument("tok")
    p.add_argument("base")
    p.add_argument("router")
    p.add_argument("wrouters", nargs="*")
    p.add_argument("--path", dest="paths", action="append", required=True)

    add("selftest")

    if len(sys.argv) < 2 or sys.argv[1] not in parsers:
        if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        die(f"usage: {PROG} {{{','.join(parsers)}}} ... (--help)", 2)
    a = parsers[sys.argv[1]].parse_intermixed_args(sys.argv[2:])
    {"features": cmd_features, "compare-features": cmd_compare_features,
     "compare-scores": cmd_compare_scores, "compare-eval": cmd_compare_eval,
     "selftest": cmd_selftest}[sys.argv[1]](a)


if __name__ == "__main__":
    main()
