#!/usr/bin/python3
"""Load a directory written by `dpc-train-path --export` as Hugging Face's GPT2LMHeadModel and
print its mean loss over the windows `dpc-train-path --eval` uses.

usage: hf_export_check.py DIR TOKENS MAX_TOKENS

With `transformers` importable, the model is transformers' own GPT2LMHeadModel built from
DIR/config.json. Without it (Debian ships no transformers), the same module tree is rebuilt
here from transformers' GPT-2 layout, written from its documented structure rather than from
our C code: GPT2LMHeadModel = {transformer: GPT2Model, lm_head: Linear(n_embd, vocab,
bias=False)}, GPT2Model = {wte, wpe: Embedding; h: ModuleList of GPT2Block; ln_f: LayerNorm},
GPT2Block = {ln_1, attn: {c_attn, c_proj}, ln_2, mlp: {c_fc, c_proj}}, each c_* a Conv1D
whose weight is [in, out] (y = x W + b); gelu_new is the tanh approximation. Either way the
state dict is loaded with strict=True, so a wrong name, a missing or extra tensor, or a wrong
shape fails here. The loss is computed in float64.

Prints one JSON line {"loss": x, "tokens": n, "impl": "transformers" | "rebuilt"}.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import read_tokfile, st_read  # noqa: E402  (file readers only)


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D(nf, nx): weight [nx, nf], bias [nf]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(
            *x.shape[:-1], self.weight.shape[1])


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = Conv1D(3 * c["n_embd"], c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], c["n_embd"])

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(hs)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(4 * c["n_embd"], c["n_embd"])
        self.c_proj = Conv1D(c["n_embd"], 4 * c["n_embd"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))  # gelu_new


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        eps = c["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.attn = Attention(c)
        self.ln_2 = nn.LayerNorm(c["n_embd"], eps=eps)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["layer_norm_epsilon"])

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Model(c)
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)

    def forward(self, idx):
        return self.lm_head(self.transformer(idx))


def main():
    d, tokens, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
    assert cfg["activation_function"] == "gelu_new" and not cfg["tie_word_embeddings"], cfg
    tensors, meta = st_read(os.path.join(d, "model.safetensors"))
    assert meta.get("format") == "pt", meta
    sd = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    try:
        import transformers
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))
        impl = "transformers"
    except ImportError:
        model = GPT2LMHeadModel(cfg)
        impl = "rebuilt"
    model.load_state_dict(sd, strict=True)
    model = model.double().eval()

    toks = read_tokfile(tokens)[0]
    T = cfg["n_positions"]
    nwin = (len(toks) - 1) // T
    if max_tokens > 0:
        nwin = min(nwin, max_tokens // T)
    x = torch.tensor(np.stack([toks[w * T:w * T + T] for w in range(nwin)]))
    y = torch.tensor(np.stack([toks[w * T + 1:w * T + T + 1] for w in range(nwin)]))
    with torch.no_grad():
        logits = model(x)
        logits = logits.logits if hasattr(logits, "logits") else logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    print(json.dumps({"loss": loss.item(), "tokens": int(y.numel()), "impl": impl},
                     separators=(",", ":")))


if __name__ == "__main__":
    main()
