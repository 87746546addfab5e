#!/usr/bin/python3
"""gpt2_torch.py - an independent PyTorch reference for dpc-train-path (test/ref, not shipped).

Written from DESIGN.md "The model", the dpc-train-path contract (dpc-train-path(1): batch
sampling, LR schedule, clipping, AdamW groups, checkpoint names) and the Philox mapping of
lib/common/rng.h, not from the model or trainer code, so that the C trainer can be checked
against it:
GPT-2 with pre-LayerNorm blocks (eps 1e-5), causal multi-head attention (c_attn output is
[q | k | v], each C wide, head h = columns h*hs .. (h+1)*hs of each), tanh-GELU MLP of width
4C, final LayerNorm, untied lm_head, Hugging Face Conv1D layout y = x W + b with W [in, out];
logits = x lm_head^T.
Mixture-of-Experts blocks (dpc-config(5) MOE, the moe.* keys of the checkpoint's config dump):
the MLP of such a block is the MoE layer of lib/moe/moe.h written from its comment (softmax
gate, top-k with ties to the lower expert, renormalised scores for k > 1, GShard's auxiliary
loss, Tutel's capacity, locations first choices first, tokens in order or batch-prioritized,
dropped choices contributing nothing), GELU experts of width 4C, over all B x T tokens; the
training objective adds moe.aux_weight times the blocks' summed auxiliary losses. Gate noise
and the load-importance loss are not modelled (the reference refuses them).

Subcommands (run with /usr/bin/python3, which has torch 1.13 and numpy):
  loss CKPT TOKENS [--max-tokens N]          mean loss over the --eval windows, JSON on stdout
  step CKPT TOKENS -c CONFIG [-s K=V]... OUT one training step from CKPT as dpc-train-path(1)
                                             says;
                                             OUT holds the parameters and moments, step + 1.
                                             --at N: the batch and learning rate of step
                                             index N (a fork that kept the moments)
                                             Train keys: the checkpoint's config dump, then
                                             CONFIG, then -s; model sizes from the checkpoint
  compare A B [--base CKPT] [--all] [--rtol R] [--atol A]
                                             A against reference B, tensor by tensor
  selfcheck CKPT TOKENS -c CONFIG [-s K=V]... show that the step comparison can fail: the
                                             fp32 reference against fp64 (must pass) and
                                             against deliberately wrong variants (must fail)
  philox-kat                                 Philox4x32-10 against Random123 known answers
  selftest                                   philox-kat, LR schedule, naive forward, safetensors
  make-ckpt CONFIG OUT [-s K=V]... [--tokens TOKENS --steps K]
                                             a checkpoint made by this reference (for testing
                                             this file without the C programs)
Token files: the DPCTOKS format of lib/io/tokfile.h, or a .npy array (for tests of this file).
Exit status: 0 ok / comparison passed, 1 comparison failed or runtime error, 2 usage error.
"""
import argparse
import contextlib
import io
import json
import math
import os
import struct
import subprocess
import sys
import zlib

import numpy as np

PROG = "gpt2_torch.py"
RNG_STREAM_INIT = 1
RNG_STREAM_BATCH = 2
MASK32 = 0xFFFFFFFF


def die(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


# ---- Philox4x32-10 (Salmon et al., SC'11), the mapping of lib/common/rng.c -------------------
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorised over numpy uint64 arrays holding 32-bit values; returns four arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & np.uint64(MASK32) for c in (c0, c1, c2, c3))
    k0 = np.asarray(k0, dtype=np.uint64) & np.uint64(MASK32)
    k1 = np.asarray(k1, dtype=np.uint64) & np.uint64(MASK32)
    m0, m1, mask = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1), np.uint64(MASK32)
    for _ in range(10):
        p0 = m0 * c0  # 32 x 32 -> 64 bits: exact in uint64
        p1 = m1 * c2
        n0 = (p1 >> np.uint64(32)) ^ c1 ^ k0
        n2 = (p0 >> np.uint64(32)) ^ c3 ^ k1
        c0, c1, c2, c3 = n0, p1 & mask, n2, p0 & mask
        k0 = (k0 + np.uint64(PHILOX_W0)) & mask
        k1 = (k1 + np.uint64(PHILOX_W1)) & mask
    return c0, c1, c2, c3


def rng_philox(seed, stream, index):
    """Words for counter (index lo, index hi, stream lo, stream hi), key (seed lo, seed hi)."""
    index = np.asarray(index, dtype=np.uint64)
    return philox4x32_10(index & np.uint64(MASK32), index >> np.uint64(32),
                         stream & MASK32, stream >> 32, seed & MASK32, seed >> 32)


def rng_u64(seed, stream, index):
    w = rng_philox(seed, stream, index)
    return (w[0] << np.uint64(32)) | w[1]


def rng_below(seed, stream, index, n):
    """Scalar: (u64 * n) >> 64 with Python's exact integers (the C code's 128-bit product)."""
    return (int(rng_u64(seed, stream, index)) * int(n)) >> 64


def rng_normal(seed, stream, index):
    """Box-Muller on one block as lib/common/rng.c: u1 = (w0 + 1) / 2^32, u2 = w1 / 2^32, in
    double."""
    w = rng_philox(seed, stream, index)
    u1 = (w[0].astype(np.float64) + 1.0) / 4294967296.0
    u2 = w[1].astype(np.float64) / 4294967296.0
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)).astype(np.float32)


# Random123 kat_vectors, philox4x32 10 rounds: (counter, key) -> output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_kat():
    bad = 0
    for ctr, key, want in PHILOX_KAT:
        got = tuple(int(x) for x in philox4x32_10(*ctr, *key))
        ok = got == want
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} ctr={' '.join(f'{c:08x}' for c in ctr)} "
              f"key={' '.join(f'{k:08x}' for k in key)} -> "
              f"{' '.join(f'{g:08x}' for g in got)}"
              + ("" if ok else f" (want {' '.join(f'{x:08x}' for x in want)})"))
    # The mapping onto (seed, stream, index): counter (index lo, index hi, stream lo, stream hi).
    ctr, key, want = PHILOX_KAT[2]
    seed = key[0] | key[1] << 32
    index = ctr[0] | ctr[1] << 32
    stream = ctr[2] | ctr[3] << 32
    got = int(rng_u64(seed, stream, index))
    ok = got == (want[0] << 32 | want[1])
    bad += not ok
    print(f"{'ok  ' if ok else 'FAIL'} rng_u64(seed={seed:#x}, stream={stream:#x}, "
          f"index={index:#x}) = {got:016x}")
    return bad == 0


# ---- safetensors, with json + numpy ---------------------------------------------------------
ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
             "I64": np.int64, "U8": np.uint8, "I8": np.int8, "U16": np.uint16}


def st_read(path):
    """(ordered dict name -> array, metadata dict). Checks structure and our crc32 keys."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(f"cannot read '{path}': {e.strerror}")
    if len(raw) < 8:
        die(f"cannot read '{path}': shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        die(f"cannot read '{path}': header length {hlen} exceeds file size {len(raw)}")
    try:
        header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        die(f"cannot read '{path}': header is not JSON: {e}")
    meta = header.pop("__metadata__", {}) or {}
    data = raw[8 + hlen:]
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = ST_DTYPES.get(e["dtype"])
        if dt is None:
            die(f"cannot read '{path}': tensor '{name}' has unsupported dtype {e['dtype']}")
        b, en = e["data_offsets"]
        n = int(np.prod(e["shape"], dtype=np.int64))
        if en > len(data) or en - b != n * np.dtype(dt).itemsize:
            die(f"cannot read '{path}': tensor '{name}' byte range {b}..{en} does not fit "
                f"shape {e['shape']} or the file")
        crc = meta.get(f"crc32.{name}")
        if crc is not None and int(crc, 16) != zlib.crc32(data[b:en]):
            die(f"cannot read '{path}': tensor '{name}': checksum mismatch")
        out[name] = np.frombuffer(data, dtype=np.dtype(dt).newbyteorder("<"), count=n,
                                  offset=b).reshape(e["shape"]).copy()
    if "crc32" in meta and int(meta["crc32"], 16) != zlib.crc32(data):
        die(f"cannot read '{path}': checksum mismatch")
    return out, meta


def st_write(path, tensors, meta=None):
    """Tensors in the given order, float32 little-endian; crc32 keys as lib/io/safetensors.h."""
    header, blobs, off = {}, [], 0
    inv = {np.dtype(v): k for k, v in ST_DTYPES.items()}
    meta = dict(meta or {})
    for name, a in tensors.items():
        a = np.ascontiguousarray(a).reshape(np.shape(a))  # keeps a 0-d array 0-d
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": inv[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        meta[f"crc32.{name}"] = f"{zlib.crc32(b):08x}"
        blobs.append(b)
        off += len(b)
    data = b"".join(blobs)
    meta["crc32"] = f"{zlib.crc32(data):08x}"
    header = {"__metadata__": {k: str(v) for k, v in meta.items()}, **header}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    os.replace(tmp, path)


# ---- token files ------------------------------------------------------------------------------
def read_tokfile(path):
    """(tokens int64 [ntokens], offsets int64 [ndocs + 1], body crc32) of a DPCTOKS file.

    Layout of dpc-tokens(5) / lib/io/tokfile.h: 64-byte header (magic "DPCTOKS\0",
    u32 version, u32 vocab, u64 ndocs, u64 ntokens, u32 width, u32 crc32 of the body,
    u64 meta_bytes, u32 tokenizer kind + u64 digest (version 2; zero in version 1), u32 crc32
    of header bytes 0..59), then the tokens
    (zero-padded to 8 bytes), u64 offsets[ndocs + 1], u64 meta_offsets[ndocs + 1], metadata.
    Every field is cross-checked, so a layout change is reported, not misread."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(f"cannot read '{path}': {e.strerror}")
    if len(raw) < 64 or raw[:8] != b"DPCTOKS\0":
        die(f"cannot read '{path}': not a token file (magic {raw[:8]!r})")
    version, vocab, ndocs, ntokens, width, body_crc, meta_bytes = \
        struct.unpack_from("<IIQQIIQ", raw, 8)
    (head_crc,) = struct.unpack_from("<I", raw, 60)
    if head_crc != zlib.crc32(raw[:60]):
        die(f"cannot read '{path}': header checksum mismatch (layout changed?)")
    if version not in (1, 2) or width not in (2, 4):
        die(f"cannot read '{path}': version {version}, token width {width} (layout changed?)")
    tok_bytes = (ntokens * width + 7) // 8 * 8
    want = 64 + tok_bytes + 16 * (ndocs + 1) + meta_bytes
    if want != len(raw):
        die(f"cannot read '{path}': {ndocs} documents, {ntokens} tokens, {meta_bytes} metadata "
            f"bytes need {want} bytes, file has {len(raw)} (layout changed?)")
    if body_crc != zlib.crc32(raw[64:]):
        die(f"cannot read '{path}': checksum mismatch")
    offsets = np.frombuffer(raw, dtype="<u8", count=ndocs + 1,
                            offset=64 + tok_bytes).astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != ntokens or np.any(np.diff(offsets) < 0):
        die(f"cannot read '{path}': document offsets do not run 0..{ntokens} (layout changed?)")
    toks = np.frombuffer(raw, dtype="<u2" if width == 2 else "<u4", count=ntokens,
                         offset=64).astype(np.int64)
    if ntokens and toks.max() >= vocab:
        die(f"cannot read '{path}': token {toks.max()} >= vocab {vocab}")
    return toks, offsets, body_crc


def read_tokens(path):
    """All tokens, documents concatenated in file order, as int64 (read_tokfile), or the
    array of a .npy file."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as e:
        die(f"cannot read '{path}': {e.strerror}")
    if magic == b"\x93NUMPY":
        return np.load(path).astype(np.int64).ravel()
    return read_tokfile(path)[0]


# ---- configs ----------------------------------------------------------------------------------
TRAIN_KEYS = {"batch_size": int, "steps": int, "lr": float, "warmup_steps": int,
              "min_lr_frac": float, "weight_decay": float, "beta1": float, "beta2": float,
              "eps": float, "grad_clip": float, "seed": int}
MODEL_KEYS = ("n_layer", "n_embd", "n_head", "seq_len", "vocab_size")


def parse_scalar(s):
    s = s.strip().strip('"').strip("'")
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def flatten_config_text(text):
    """section.key -> value from YAML (model: / train: mappings) or from lines of the form
    'section.key = value' / 'section.key: value' (the checkpoint's canonical dump, whatever
    its exact spelling)."""
    flat = {}
    try:
        import yaml
        doc = yaml.safe_load(text)
    except Exception:
        doc = None
    if isinstance(doc, dict) and any(isinstance(v, dict) for v in doc.values()):
        for sec, kv in doc.items():
            if isinstance(kv, dict):
                for k, v in kv.items():
                    flat[f"{sec}.{k}"] = v
        return flat
    if isinstance(doc, dict):
        return {k: v for k, v in doc.items() if "." in str(k)}
    section = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line.endswith(":") and not line.startswith((" ", "\t")):
            section = line[:-1].strip()
            continue
        for sep in ("=", ":"):
            if sep in line:
                k, v = line.split(sep, 1)
                k = k.strip()
                if "." not in k and section:
                    k = f"{section}.{k}"
                flat[k] = parse_scalar(v)
                break
    return flat


def load_config(path, sets, ckpt_meta=None):
    """Config file, then -s overrides; keys still missing come from the checkpoint's own
    config dump. A key found nowhere is an error (no silent defaults)."""
    flat = {}
    if ckpt_meta and ckpt_meta.get("config"):
        flat.update(flatten_config_text(ckpt_meta["config"]))
    if path:
        try:
            with open(path) as f:
                flat.update(flatten_config_text(f.read()))
        except OSError as e:
            die(f"cannot read '{path}': {e.strerror}", 2)
    for a in sets or []:
        if "=" not in a:
            die(f"-s '{a}': expected SECTION.KEY=VALUE", 2)
        k, v = a.split("=", 1)
        flat[k.strip()] = parse_scalar(v)
    cfg = {}
    for k, conv in TRAIN_KEYS.items():
        v = flat.get(f"train.{k}")
        if v is None:
            die(f"'{path}': train.{k} is not set (nor in the checkpoint's config)", 2)
        cfg[k] = conv(v)
    model = {k: flat.get(f"model.{k}") for k in MODEL_KEYS}
    mo = moe_from_flat(flat, path)
    if mo is not None:
        model["moe"] = mo
    return cfg, model


MOE_KEYS = {"experts": int, "top_k": int, "every": int, "blocks": str,
            "capacity_factor": float, "bpr": lambda v: str(v).lower() == "true",
            "gate_noise": float, "aux_loss": str, "aux_weight": float}


MOE_DEFAULTS = {"experts": 0, "top_k": 2, "every": 2, "blocks": "", "capacity_factor": 1.0,
                "bpr": "false", "gate_noise": 0.0, "aux_loss": "gshard", "aux_weight": 0.01}


def moe_from_flat(flat, path):
    """The moe section (a dict, with "is": the MoE blocks) of a flat config, or None."""
    if int(flat.get("moe.experts", 0) or 0) == 0:
        return None
    mo = {}
    for k, conv in MOE_KEYS.items():  # a key a YAML file leaves out has dpc-config(5)'s default
        mo[k] = conv(flat.get(f"moe.{k}", MOE_DEFAULTS[k]))
    if mo["gate_noise"] != 0 or mo["aux_loss"] != "gshard":
        die(f"'{path}': the reference models neither gate noise nor the load-importance loss", 2)
    return mo


def moe_blocks(mo, L):
    """The MoE blocks of dpc-config(5): the moe.blocks list, else (b + 1) % every == 0."""
    if mo is None:
        return set()
    if mo["blocks"]:
        out = set()
        for item in str(mo["blocks"]).split(","):
            lo, _, hi = item.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
        return out
    return {b for b in range(L) if (b + 1) % mo["every"] == 0}


def model_from_meta(meta, path):
    try:
        m = {k: int(meta[k]) for k in MODEL_KEYS}
    except (KeyError, ValueError) as e:
        die(f"cannot read '{path}': metadata lacks model size {e}")
    mo = moe_from_flat(flatten_config_text(meta.get("config", "")), path)
    if mo is not None:
        m["moe"] = mo
    return m


# ---- the model --------------------------------------------------------------------------------
def param_shapes(m):
    """HF GPT-2 names and shapes, in the order of lib/model/gpt2.h."""
    L, C, T, V = m["n_layer"], m["n_embd"], m["seq_len"], m["vocab_size"]
    moe = moe_blocks(m.get("moe"), L)
    s = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(L):
        p = f"h.{i}."
        s += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,))]
        if i in moe:  # lib/moe's wg [M,E], w1 [E,M,H], b1 [E,H], w2 [E,H,M], b2 [E,M]
            E = m["moe"]["experts"]
            s += [(p + "moe.gate.weight", (C, E)), (p + "moe.fc1.weight", (E, C, 4 * C)),
                  (p + "moe.fc1.bias", (E, 4 * C)), (p + "moe.fc2.weight", (E, 4 * C, C)),
                  (p + "moe.fc2.bias", (E, C))]
        else:
            s += [(p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                  (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    # a window router's head is over its paths (metadata n_out), a language model's over V
    s += [("ln_f.weight", (C,)), ("ln_f.bias", (C,)), ("lm_head.weight", (m.get("n_out") or V, C))]
    return s


def init_params(m, seed):
    """GPT-2 init of dpc-train-path(1) with the draws of lib/model/gpt2.h (element i of the flat
    buffer, views in HF order, uses draw i of RNG_STREAM_INIT). Matrices and embeddings N(0, 0.02),
    residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1."""
    out, base = {}, 0
    for name, shape in param_shapes(m):
        n = int(np.prod(shape))
        if name.endswith(".bias"):
            a = np.zeros(n, np.float32)
        elif ".ln_" in name or name.startswith("ln_f"):
            a = np.ones(n, np.float32)
        else:
            resid = name.endswith("c_proj.weight") or name.endswith("moe.fc2.weight")
            std = 0.02 / math.sqrt(2 * m["n_layer"]) if resid else 0.02
            idx = np.arange(base, base + n, dtype=np.uint64)
            a = (np.float32(std) * rng_normal(seed, RNG_STREAM_INIT, idx)).astype(np.float32)
        out[name] = a.reshape(shape)
        base += n
    return out


def moe_capacity(counts, N, E, k, x):
    """lib/moe/moe.h 4.: C from the setting x and the counts n_e (Python integers)."""
    need = max(counts)
    if x > 0:
        return k * int(x * (-(-N // E)))
    if x == 0:
        return need
    return min(need, k * int(abs(x) * (-(-N // E))))


def moe_forward(h, P, p, mo, gelu, mutate=None, train=True):
    """An MoE block's MLP on h [B,T,C] (every token of the batch routed together): the output
    and the GShard auxiliary loss, both differentiable (the routing itself is not), and the
    routing's capacity C and dropped choices."""
    import torch
    C = h.shape[-1]
    x = h.reshape(-1, C)
    N, E, k = x.shape[0], mo["experts"], mo["top_k"]
    probs = (x @ P[p + "moe.gate.weight"]).softmax(-1)
    # top-k, descending, ties to the lower expert (a stable sort keeps index order)
    order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices
    idx = order[:, :k]
    sel = probs.gather(1, idx)
    if k == 1 or mutate == "moe_no_renorm":
        score = sel
    else:
        score = sel / sel.sum(1, keepdim=True).clamp(min=float(np.finfo(np.float32).eps))
    mask1 = torch.zeros(N, E, dtype=probs.dtype)
    mask1[torch.arange(N), idx[:, 0]] = 1.0
    aux = E * (mask1.mean(0) * probs.mean(0)).sum()
    ix = idx.numpy()
    counts = [int((ix == e).sum()) for e in range(E)]
    # evaluation drops nothing (capacity setting 0): its loss does not depend on the batching
    cap = moe_capacity(counts, N, E, k, mo["capacity_factor"] if train else 0.0)
    if mutate == "moe_capacity_plus_one":
        cap += 1
    tokens = range(N)
    if mo["bpr"] and mutate != "moe_no_bpr":  # the highest first gate first, ties in order
        top = probs.detach()[torch.arange(N), idx[:, 0]].numpy()
        tokens = np.argsort(-top, kind="stable")
    # slots: choice r of the tokens in order (or BPR order) after every choice r' < r, each
    # expert counting its own: a running count (cumsum of one-hot rows) from the ranks before
    order = np.asarray(list(tokens), dtype=np.int64)
    keep = np.zeros((N, k), dtype=bool)
    fill = np.zeros(E, dtype=np.int64)
    for r in range(k):
        e = ix[order, r]
        onehot = np.zeros((N, E), dtype=np.int64)
        onehot[np.arange(N), e] = 1
        loc = np.cumsum(onehot, axis=0)[np.arange(N), e] - 1 + fill[e]
        keep[order, r] = loc < cap
        fill += onehot.sum(0)
    y = torch.zeros_like(x)
    for e in range(E):
        t, r = np.nonzero((ix == e) & keep)
        if len(t) == 0:
            continue
        t, r = torch.from_numpy(t), torch.from_numpy(r)
        a = gelu(x[t] @ P[p + "moe.fc1.weight"][e] + P[p + "moe.fc1.bias"][e])
        out = a @ P[p + "moe.fc2.weight"][e] + P[p + "moe.fc2.bias"][e]
        y = y.index_add(0, t, score[t, r].unsqueeze(1) * out)
    return y.view(h.shape), aux, {"C": cap, "need": max(counts), "dropped": int((~keep).sum())}


def forward(P, idx, targets, m, mutate=None, aux_out=None, train=False):
    """Mean cross-entropy (and per-token losses) of tokens idx [B,T] against targets; each MoE
    block's (auxiliary loss, routing) is appended to aux_out when given. train: a training
    step's forward (the configured capacity), else an evaluation's (nothing dropped)."""
    import torch
    import torch.nn.functional as F
    B, T = idx.shape
    C, NH, L = m["n_embd"], m["n_head"], m["n_layer"]
    moe = moe_blocks(m.get("moe"), L)
    hs = C // NH
    eps = 1e-6 if mutate == "ln_eps" else 1e-5
    gelu = (lambda z: F.gelu(z)) if mutate == "gelu_exact" else \
        (lambda z: F.gelu(z, approximate="tanh"))

    def lin(x, w, b):  # Conv1D: y = x W + b, W [in, out]
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])

    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(L):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        q, k, v = lin(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"]).split(C, -1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        if mutate != "no_causal":
            att = att.masked_fill(mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        if i in moe:
            y, aux, route = moe_forward(h, P, p, m["moe"], gelu, mutate, train)
            x = x + y
            if aux_out is not None:
                aux_out.append((aux, route))
            continue
        h = gelu(lin(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]))
        x = x + lin(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps)
    logits = x.reshape(-1, C) @ P["lm_head.weight"].t()
    losses = F.cross_entropy(logits, targets.reshape(-1), reduction="none")
    return losses.mean(), losses


def lr_at(cfg, s, mutate=None):
    """dpc-train-path(1): linear warmup to lr, then cosine to lr*min_lr_frac at train.steps."""
    if mutate == "lr_off_by_one":
        s += 1
    lr, w, n = cfg["lr"], cfg["warmup_steps"], cfg["steps"]
    if s < w:
        return lr * (s + 1) / w
    p = min(1.0, (s - w) / max(1, n - w))
    f = cfg["min_lr_frac"]
    return lr * (f + (1 - f) * 0.5 * (1 + math.cos(math.pi * p)))


def batch_starts(cfg, ntokens, T, s):
    """Row b of step index s starts at rng_below(seed, BATCH, s*B + b, ntokens - T)."""
    B = cfg["batch_size"]
    if ntokens < T + 1:
        die(f"token file has {ntokens} tokens, fewer than seq_len + 1 = {T + 1}")
    return [rng_below(cfg["seed"], RNG_STREAM_BATCH, s * B + b, ntokens - T) for b in range(B)]


def get_batch(toks, starts, T):
    import torch
    x = np.stack([toks[a:a + T] for a in starts])
    y = np.stack([toks[a + 1:a + T + 1] for a in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def to_torch(arrs, dtype):
    import torch
    return {k: torch.tensor(np.asarray(v), dtype=dtype) for k, v in arrs.items()}


def train_step(P, M, V, step, toks, cfg, m, dtype, mutate=None, at=None):
    """One step of dpc-train-path(1) from parameters P, moments M, V (numpy, by name) after `step`
    steps. at: the step index whose batch and learning rate are used, when it is not `step`
    (a DiPaCo fork that took the moments restarts its schedule at 0 while AdamW's bias
    correction counts on from `step`). Returns (new params, new exp_avg, new exp_avg_sq,
    info)."""
    sched = step if at is None else at
    import torch
    T = m["seq_len"]
    params = to_torch(P, dtype)
    names = [n for n, _ in param_shapes(m)]
    for n in names:
        params[n].requires_grad_(True)
    starts = batch_starts(cfg, len(toks), T, sched)
    x, y = get_batch(toks, starts, T)
    auxes = []
    loss, _ = forward(params, x, y, m, mutate, auxes, train=True)
    aux = sum(a for a, _ in auxes) if auxes else None
    objective = loss
    if aux is not None:  # the MoE blocks' auxiliary losses at their weight
        w = 0.0 if mutate == "moe_no_aux" else m["moe"]["aux_weight"]
        objective = loss + w * aux
    objective.backward()
    grads = [params[n].grad for n in names]
    if mutate == "kbias_grad":  # a reduction bug: a real gradient lands in the key bias
        for i in range(m["n_layer"]):
            g = params[f"h.{i}.attn.c_attn.bias"].grad
            C = m["n_embd"]
            g[C:2 * C] += g[0:C]
    # Global L2 norm of all gradients (accumulated in float64), clip scale clip/norm.
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    clip = cfg["grad_clip"]
    scale = clip / norm if (clip > 0 and norm > clip and mutate != "no_clip") else 1.0
    if scale != 1.0:
        for g in grads:
            g.mul_(scale)
    lr = lr_at(cfg, sched, mutate)
    # weight decay on matrices (an MoE block's are [C,E] and [E,in,out]), not on biases
    def decays(n):
        return (params[n].dim() >= 2 and not n.endswith(".bias")) or mutate == "decay_all"
    decay = [params[n] for n in names if decays(n)]
    nodecay = [params[n] for n in names if not decays(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}], lr=lr,
                            betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                            foreach=False)
    t0 = step - 1 if mutate == "bias_corr_t" else step
    for n in names:
        opt.state[params[n]] = {"step": torch.tensor(float(t0)),
                                "exp_avg": torch.tensor(M[n], dtype=dtype),
                                "exp_avg_sq": torch.tensor(V[n], dtype=dtype)}
    with torch.no_grad():
        opt.step()
    newP = {n: params[n].detach().to(torch.float32).numpy() for n in names}
    newM = {n: opt.state[params[n]]["exp_avg"].to(torch.float32).numpy() for n in names}
    newV = {n: opt.state[params[n]]["exp_avg_sq"].to(torch.float32).numpy() for n in names}
    info = {"step": sched, "loss": float(loss), "grad_norm": norm, "clip_scale": scale, "lr": lr,
            "batch_starts": starts}
    if aux is not None:
        info["aux_loss"] = float(aux)
        info["moe_routes"] = [r for _, r in auxes]
    return newP, newM, newV, info


def load_ckpt(path):
    t, meta = st_read(path)
    m = model_from_meta(meta, path)
    names = [n for n, _ in param_shapes(m)]
    for n, shape in param_shapes(m):
        for key in (n, f"optim.exp_avg.{n}", f"optim.exp_avg_sq.{n}"):
            if key not in t:
                die(f"cannot read '{path}': no tensor '{key}'")
            if tuple(t[key].shape) != shape:
                die(f"cannot read '{path}': '{key}' has shape {list(t[key].shape)}, "
                    f"expected {list(shape)}")
    P = {n: t[n] for n in names}
    M = {n: t[f"optim.exp_avg.{n}"] for n in names}
    V = {n: t[f"optim.exp_avg_sq.{n}"] for n in names}
    step = int(meta.get("step", "0"))
    return P, M, V, step, m, meta


def write_ckpt(path, P, M, V, step, m, cfg=None):
    tensors = dict(P)
    tensors.update({f"optim.exp_avg.{n}": a for n, a in M.items()})
    tensors.update({f"optim.exp_avg_sq.{n}": a for n, a in V.items()})
    meta = {"format": "dpc-checkpoint", "kind": "path", "step": str(step),
            "writer": "test/ref/gpt2_torch.py", **{k: str(v) for k, v in m.items() if k != "moe"}}
    moe = [f"moe.{k}: {v}" for k, v in (m.get("moe") or {}).items()]
    if cfg or moe:
        meta["config"] = "\n".join([f"model.{k}: {v}" for k, v in m.items() if k != "moe"]
                                   + [f"train.{k}: {v}" for k, v in (cfg or {}).items()]
                                   + moe) + "\n"
    st_write(path, tensors, meta)


# ---- subcommands ------------------------------------------------------------------------------
def cmd_loss(a):
    import torch
    P, _, _, _, m, _ = load_ckpt(a.ckpt)
    toks = read_tokens(a.tokens)
    T = m["seq_len"]
    starts, start = [], 0
    while start + T + 1 <= len(toks):
        if a.max_tokens is not None and (len(starts) + 1) * T > a.max_tokens:
            break
        starts.append(start)
        start += T
    if not starts:
        die(f"'{a.tokens}': {len(toks)} tokens, no window of {T} + 1")
    params = to_torch(P, torch.float64 if a.fp64 else torch.float32)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(starts), 16):
            x, y = get_batch(toks, starts[i:i + 16], T)
            _, losses = forward(params, x, y, m)
            total += float(losses.double().sum())
            count += losses.numel()
    loss = total / count
    print(json.dumps({"checkpoint": a.ckpt, "data": a.tokens, "tokens": count, "loss": loss,
                      "perplexity": math.exp(loss)}))


def cmd_step(a):
    import torch
    P, M, V, step, m, meta = load_ckpt(a.ckpt)
    cfg, mcfg = load_config(a.config, a.set, meta)
    for k, v in mcfg.items():
        if k == "moe":
            if v != m.get("moe"):
                die(f"'{a.config}': its moe section is not the checkpoint's", 2)
        elif v is not None and int(v) != m[k]:
            die(f"'{a.config}': model.{k} = {v} but the checkpoint has {m[k]}", 2)
    toks = read_tokens(a.tokens)
    dtype = torch.float64 if a.fp64 else torch.float32
    nP, nM, nV, info = train_step(P, M, V, step, toks, cfg, m, dtype, a.mutate, a.at)
    write_ckpt(a.out, nP, nM, nV, step + 1, m)
    info["out"] = a.out
    print(json.dumps(info))


def split_null(name, a):
    """Pieces of a tensor to compare separately. The key slice of c_attn.bias has exactly zero
    gradient in exact arithmetic (adding q.b to every score of a row leaves the softmax
    unchanged), so its gradient is rounding noise in any implementation, and AdamW turns that
    noise into updates of up to ~lr. It is reported, never gated, as a parameter; its moments
    are gated (a real gradient there would move exp_avg by orders more than noise does)."""
    base = name.split("optim.exp_avg_sq.")[-1].split("optim.exp_avg.")[-1]
    if base.endswith("attn.c_attn.bias") and a.ndim == 1 and a.shape[0] % 3 == 0:
        C = a.shape[0] // 3
        return [(f"{name}[q]", slice(0, C), False), (f"{name}[k]", slice(C, 2 * C), True),
                (f"{name}[v]", slice(2 * C, 3 * C), False)]
    return [(name, slice(None), False)]


def compare(A, B, rtol, atol, names, quantum=None):
    """Per tensor: max |a-b|, max |a-b|/|b|, the worst element by |a-b| / (atol + rtol|b|),
    the relative L2 error ||a-b|| / ||b||, and l2_ratio = ||a-b|| / (rtol ||b|| + ||q||),
    where q (quantum[name], default 0) is a per-element allowance for float32 storage, all
    in float64. B is the reference."""
    rows = []
    for n in names:
        if A[n].shape != B[n].shape:
            rows.append({"name": n, "shape_mismatch": [list(A[n].shape), list(B[n].shape)]})
            continue
        for piece, sl, null in split_null(n, B[n]):
            a = A[n].astype(np.float64).ravel()[sl]
            b = B[n].astype(np.float64).ravel()[sl]
            d = np.abs(a - b)
            ratio = d / (atol + rtol * np.abs(b))
            w = int(np.argmax(ratio)) if d.size else 0
            nb = float(np.linalg.norm(b))
            nq = float(np.linalg.norm(quantum[n].ravel()[sl])) if quantum else 0.0
            nd = float(np.linalg.norm(a - b))
            rows.append({"name": piece, "null": null and not n.startswith("optim."),
                         "max_abs": float(d.max(initial=0)),
                         "max_rel": float((d / np.maximum(np.abs(b), 1e-30)).max(initial=0)),
                         "elem_ratio": float(ratio.max(initial=0)), "worst_index": w,
                         "worst_a": float(a[w]) if d.size else 0.0,
                         "worst_b": float(b[w]) if d.size else 0.0,
                         "rel_l2": float(np.linalg.norm(a - b)) / nb if nb > 0 else
                         float(np.linalg.norm(a - b)),
                         "l2_ratio": nd / (rtol * nb + nq) if rtol * nb + nq > 0 else
                         (0.0 if nd == 0 else math.inf),
                         "n_bad": int((ratio > 1).sum())})
    return rows


def report(rows, gate, rtol, label="", stats=None, key=None):
    """Prints the worst tensors by each metric; True when the gated metric passes.
    gate "elem": every element |a-b| <= atol + rtol|b|; "l2": every tensor ||a-b||/||b|| <=
    rtol; "both": both. Rows flagged null (key bias, see split_null) are only printed."""
    bad_shape = [r for r in rows if "shape_mismatch" in r]
    for r in bad_shape:
        print(f"{label}shape mismatch {r['name']}: {r['shape_mismatch']}")
    rows = [r for r in rows if "shape_mismatch" not in r]
    null = [r for r in rows if r["null"]]
    rows = [r for r in rows if not r["null"]]
    if not rows:
        print(f"{label}no tensors to compare")
        return False
    we = max(rows, key=lambda r: r["elem_ratio"])
    wl = max(rows, key=lambda r: r["l2_ratio"])
    wa = max(rows, key=lambda r: r["max_abs"])
    wr = max(rows, key=lambda r: r["max_rel"])
    ok_elem = we["elem_ratio"] <= 1.0
    ok_l2 = wl["l2_ratio"] <= 1.0
    mark = lambda g: " [gated]" if gate in (g, "both") else ""
    print(f"{label}{len(rows)} tensors; max abs diff {wa['max_abs']:.3e} ({wa['name']}); "
          f"max rel diff {wr['max_rel']:.3e} ({wr['name']})")
    print(f"{label}elementwise |a-b| <= atol + rtol|b|{mark('elem')}: worst {we['name']} "
          f"[{we['worst_index']}] a={we['worst_a']:.9g} b={we['worst_b']:.9g}, "
          f"|a-b|/(atol+rtol|b|) = {we['elem_ratio']:.3g}, "
          f"{sum(r['n_bad'] for r in rows)} elements over")
    print(f"{label}relative L2 per tensor{mark('l2')}: worst {wl['name']} {wl['rel_l2']:.3e} "
          f"(limit {rtol:g}{' + float32 quantum' if wl['l2_ratio'] * rtol != wl['rel_l2'] else ''}"
          f", {wl['l2_ratio']:.3g} of it); largest "
          f"{max(r['rel_l2'] for r in rows):.3e}")
    if null:
        wn = max(null, key=lambda r: r["max_abs"])
        print(f"{label}not gated (zero true gradient, see split_null): max abs diff "
              f"{wn['max_abs']:.3e} ({wn['name']})")
    ok = (ok_elem if gate == "elem" else ok_l2 if gate == "l2" else ok_elem and ok_l2)
    if stats is not None:  # gated value over its limit (<= 1 passes)
        stats[key] = we["elem_ratio"] if gate == "elem" else wl["l2_ratio"]
    return ok and not bad_shape


NULL_MOMENT_ATOL = 1e-8


def compare_files(A, B, base, rtol, atol, moments, label="", stats=None):
    """The gated comparison of a stepped checkpoint A against the reference B (see the report
    of test/sh/t-torch-reference.sh for why these tolerances):
      parameters: every element |a-b| <= atol + rtol|b|;
      updates (a - base, b - base; when base is given): per tensor
        ||da - db|| <= rtol ||db|| + ||ulp(b)|| (both results are rounded to float32, so
        they may differ by one unit in the last place whatever the update's size: a
        LayerNorm weight near 1 has ulp 1.2e-7 against updates of ~lr);
      moments (when moments): relative L2 per tensor <= rtol, and the key-bias slices
        |a-b| <= NULL_MOMENT_ATOL."""
    pn = [n for n in B if n in A and not n.startswith("optim.")]
    missing = [n for n in B if n not in A and (moments or not n.startswith("optim."))]
    ok = not missing
    if missing:
        print(f"{label}tensors missing from the file under test: {', '.join(missing[:8])}"
              + (" ..." if len(missing) > 8 else ""))
    print(f"{label}parameters:")
    ok &= report(compare(A, B, rtol, atol, pn), "elem", rtol, label + "  ", stats, "params")
    if base is not None:
        un = [n for n in pn if n in base and base[n].shape == B[n].shape]
        dA = {n: A[n].astype(np.float64) - base[n] for n in un if A[n].shape == B[n].shape}
        dB = {n: B[n].astype(np.float64) - base[n] for n in dA}
        ulp = {n: np.spacing(np.abs(B[n].astype(np.float32))).astype(np.float64) for n in dA}
        print(f"{label}updates (parameter minus the starting checkpoint's):")
        ok &= report(compare(dA, dB, rtol, atol, list(dA), ulp), "l2", rtol, label + "  ",
                     stats, "updates")
    if moments:
        mn = [n for n in B if n in A and n.startswith("optim.")]
        rows = compare(A, B, rtol, atol, mn)
        if stats is not None:
            stats["kbias_moments"] = max([r["max_abs"] for r in rows if "[k]" in r["name"]],
                                         default=0.0) / NULL_MOMENT_ATOL
        for r in rows:  # the key-bias moments: gated in absolute terms
            if "[k]" in r["name"] and r["max_abs"] > NULL_MOMENT_ATOL:
                print(f"{label}  {r['name']}: max abs diff {r['max_abs']:.3e} > "
                      f"{NULL_MOMENT_ATOL:g} (a real gradient where there should be none)")
                ok = False
        print(f"{label}AdamW moments (key-bias slices |a-b| <= {NULL_MOMENT_ATOL:g}):")
        ok &= report([r for r in rows if "[k]" not in r["name"]], "l2", rtol, label + "  ",
                     stats, "moments")
    return ok


def cmd_compare(a):
    A, _ = st_read(a.a)
    B, _ = st_read(a.b)
    base = st_read(a.base)[0] if a.base else None
    if a.verbose:
        names = [n for n in B if n in A and A[n].shape == B[n].shape]
        for r in sorted(compare(A, B, a.rtol, a.atol, names), key=lambda r: -r["elem_ratio"]):
            print(json.dumps(r))
    ok = compare_files(A, B, base, a.rtol, a.atol, a.all)
    print(f"compare {a.a} vs reference {a.b}{' from ' + a.base if a.base else ''} "
          f"(rtol {a.rtol:g}, atol {a.atol:g}): {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


MUTANTS = ["gelu_exact", "ln_eps", "no_causal", "no_clip", "decay_all", "lr_off_by_one",
           "bias_corr_t", "kbias_grad"]
# an MoE model's: one more slot per expert (detected where the capacity drops choices), the
# auxiliary loss left out of the objective, scores not renormalised over the k choices, slots
# in token order although batch-prioritized routing is on
MOE_MUTANTS = ["moe_capacity_plus_one", "moe_no_aux", "moe_no_renorm", "moe_no_bpr"]


def cmd_selfcheck(a):
    """The step comparison must pass fp32 vs fp64 (reduction order and rounding only) and must
    fail for each deliberately wrong variant; prints the margins both ways."""
    import torch
    P, M, V, step, m, meta = load_ckpt(a.ckpt)
    cfg, _ = load_config(a.config, a.set, meta)
    toks = read_tokens(a.tokens)

    def run(dtype, mutate=None):
        p, mm, vv, info = train_step(P, M, V, step, toks, cfg, m, dtype, mutate)
        out = dict(p)
        out.update({f"optim.exp_avg.{n}": x for n, x in mm.items()})
        out.update({f"optim.exp_avg_sq.{n}": x for n, x in vv.items()})
        return out, info

    ref, info = run(torch.float64)
    print(f"step index {step}: lr {info['lr']:.6g}, loss {info['loss']:.6f}, grad_norm "
          f"{info['grad_norm']:.6g}, clip scale {info['clip_scale']:.6g}")
    print("fp32 vs fp64 (must PASS), full report:")
    st = {}
    ok = compare_files(run(torch.float32)[0], ref, P, a.rtol, a.atol, True, "  ", st)
    cols = ["params", "updates", "moments", "kbias_moments"]
    print("gated metric / its limit (<= 1 passes): params = max |a-b|/(atol+rtol|b|), "
          "updates = max ||a-b||/(rtol||b||+||ulp||), moments = max relative L2 / rtol, "
          f"kbias_moments = max |a-b| / {NULL_MOMENT_ATOL:g}")
    print(f"  {'variant':14s} " + " ".join(f"{c:>13s}" for c in cols) + "  verdict")
    print(f"  {'fp32':14s} " + " ".join(f"{st.get(c, 0):13.3g}" for c in cols)
          + f"  {'pass (ok)' if ok else 'FAIL (must pass)'}")
    for mu in a.mutants.split(","):
        if mu == "no_clip" and info["clip_scale"] == 1.0:
            print(f"  {mu:14s} not exercised (the gradient was not clipped)")
            continue
        if mu not in MUTANTS + MOE_MUTANTS:
            die(f"--mutants: unknown variant '{mu}'", 2)
        if mu in MOE_MUTANTS and "moe" not in m:
            print(f"  {mu:14s} not exercised (the model has no MoE block)")
            continue
        st = {}
        with contextlib.redirect_stdout(io.StringIO()):
            passed = compare_files(run(torch.float32, mu)[0], ref, P, a.rtol, a.atol, True,
                                   "", st)
        ok &= not passed
        print(f"  {mu:14s} " + " ".join(f"{st.get(c, 0):13.3g}" for c in cols)
              + f"  {'pass (NOT DETECTED)' if passed else 'fail (detected)'}")
    print(f"selfcheck: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


def cmd_make_ckpt(a):
    """A checkpoint of this reference: init_params(seed), zero moments, then --steps steps."""
    import torch
    cfg, model = load_config(a.config, a.set)
    m = {k: int(model[k]) for k in MODEL_KEYS}
    if model.get("moe"):
        m["moe"] = model["moe"]
    P = init_params(m, cfg["seed"])
    M = {n: np.zeros_like(v) for n, v in P.items()}
    V = {n: np.zeros_like(v) for n, v in P.items()}
    step = 0
    if a.steps:
        toks = read_tokens(a.tokens)
        for step in range(a.steps):
            P, M, V, info = train_step(P, M, V, step, toks, cfg, m, torch.float32)
            print(json.dumps(info), file=sys.stderr)
        step = a.steps
    write_ckpt(a.out, P, M, V, step, m, cfg)


def naive_losses(P, idx, targets, m):
    """A second, loop-by-loop float64 forward (numpy) to check forward() against: per head,
    per query position, the textbook formulas (LayerNorm with biased variance, tanh-GELU
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), softmax over keys j <= i)."""
    P = {k: v.astype(np.float64) for k, v in P.items()}
    C, NH, L, V = m["n_embd"], m["n_head"], m["n_layer"], m["vocab_size"]
    hs = C // NH

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w + b

    out = []
    for row, tgt in zip(idx, targets):
        T = len(row)
        x = np.stack([P["wte.weight"][row[t]] + P["wpe.weight"][t] for t in range(T)])
        for i in range(L):
            p = f"h.{i}."
            h = ln(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
            qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
            y = np.zeros((T, C))
            for hd in range(NH):
                q = qkv[:, hd * hs:(hd + 1) * hs]
                k = qkv[:, C + hd * hs:C + (hd + 1) * hs]
                v = qkv[:, 2 * C + hd * hs:2 * C + (hd + 1) * hs]
                for t in range(T):
                    sc = np.array([q[t] @ k[j] / math.sqrt(hs) for j in range(t + 1)])
                    w = np.exp(sc - sc.max())
                    w /= w.sum()
                    y[t, hd * hs:(hd + 1) * hs] = w @ v[:t + 1]
            x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
            h = ln(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
            u = h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"]
            u = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
            x = x + u @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
        x = ln(x, P["ln_f.weight"], P["ln_f.bias"])
        for t in range(T):
            z = P["lm_head.weight"] @ x[t]
            zmax = z.max()
            out.append(zmax + math.log(np.exp(z - zmax).sum()) - z[tgt[t]])
    assert len(z) == V
    return np.array(out)


def cmd_selftest(a):
    """Checks of this file that need no C program: Philox known answers, the LR schedule at
    hand-computed points, forward() against a naive loop forward, a safetensors round trip
    and its checksums."""
    import tempfile
    ok = philox_kat()
    cfg = {"lr": 1e-3, "warmup_steps": 10, "steps": 110, "min_lr_frac": 0.1}
    for s_, want in ((0, 1e-4), (4, 5e-4), (9, 1e-3), (10, 1e-3), (60, 1e-3 * 0.55),
                     (110, 1e-4), (500, 1e-4)):
        got = lr_at(cfg, s_)
        good = abs(got - want) <= 1e-15
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} lr at step index {s_} = {got:.6g} (want {want:g})")
    rng = np.random.default_rng(0)
    import torch
    m = {"n_layer": 2, "n_embd": 16, "n_head": 4, "seq_len": 8, "vocab_size": 11}
    P = {k: (v + rng.standard_normal(v.shape) * 0.3).astype(np.float32)
         for k, v in init_params(m, 7).items()}  # non-trivial LayerNorm weights and biases
    x = rng.integers(0, 11, (3, 8))
    y = rng.integers(0, 11, (3, 8))
    _, got = forward(to_torch(P, torch.float64), torch.from_numpy(x), torch.from_numpy(y), m)
    want = naive_losses(P, x, y, m)
    err = float(np.abs(got.numpy() - want).max())
    good = err <= 1e-10
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} forward() against the loop-by-loop float64 forward: "
          f"max |diff| of {want.size} token losses {err:.3e} (limit 1e-10)")
    ts = {"a.weight": rng.standard_normal((3, 5)).astype(np.float32),
          "b": np.arange(7, dtype=np.float32)}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        st_write(path, ts, {"step": 3})
        back, meta = st_read(path)
        good = (list(back) == list(ts) and all(np.array_equal(back[k], ts[k]) for k in ts)
                and meta["step"] == "3")
        raw = bytearray(open(path, "rb").read())
        raw[-1] ^= 1
        open(path, "wb").write(raw)
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "compare", path, path],
                           capture_output=True, text=True)
        good &= r.returncode == 1 and "checksum mismatch" in r.stderr
        ok &= good
        print(f"{'ok  ' if good else 'FAIL'} safetensors round trip; a flipped bit is "
              f"reported ({r.stderr.strip()})")
    print(f"selftest: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


# ---- command line -----------------------------------------------------------------------------
def main():
    parsers = {}

    class Sub:  # one standalone parser per subcommand, so options may follow positionals
        @staticmethod
        def add_parser(name):
            parsers[name] = argparse.ArgumentParser(prog=f"{PROG} {name}")
            return parsers[name]
    sub = Sub()

    p = sub.add_parser("loss")
    p.add_argument("ckpt")
    p.add_argument("tokens")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--fp64", action="store_true")

    p = sub.add_parser("step")
    p.add_argument("ckpt")
    p.add_argument("tokens")
    p.add_argument("out")
    p.add_argument("-c", "--config")
    p.add_argument("-s", "--set", action="append")
    p.add_argument("--fp64", action="store_true")
    p.add_argument("--mutate", choices=MUTANTS + MOE_MUTANTS)
    p.add_argument("--at", type=int, help="step index of the batch and the learning rate "
                   "(default: the checkpoint's step)")

    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b", help="the reference")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-6)
    p.add_argument("--base", help="the checkpoint both started from: also compare updates")
    p.add_argument("--all", action="store_true", help="also the optim.* moments")
    p.add_argument("-v", "--verbose", action="store_true")

    p = sub.add_parser("selfcheck")
    p.add_argument("ckpt")
    p.add_argument("tokens")
    p.add_argument("-c", "--config")
    p.add_argument("-s", "--set", action="append")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-6)
    p.add_argument("--mutants", default=",".join(MUTANTS))

    p = sub.add_parser("make-ckpt")
    p.add_argument("config")
    p.add_argument("out")
    p.add_argument("-s", "--set", action="append")
    p.add_argument("--tokens")
    p.add_argument("--steps", type=int, default=0)

    sub.add_parser("philox-kat")
    sub.add_parser("selftest")

    if len(sys.argv) < 2 or sys.argv[1] not in parsers:
        if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        die(f"usage: {PROG} {{{','.join(parsers)}}} ... (--help)", 2)
    a = parsers[sys.argv[1]].parse_intermixed_args(sys.argv[2:])
    a.cmd = sys.argv[1]
    if a.cmd == "philox-kat":
        sys.exit(0 if philox_kat() else 1)
    {"loss": cmd_loss, "step": cmd_step, "compare": cmd_compare, "selfcheck": cmd_selfcheck,
     "make-ckpt": cmd_make_ckpt, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()
