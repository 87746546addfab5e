#!/usr/bin/python3
"""Write the seed corpus of the fuzz harnesses under test/fuzz/corpus/ (committed; rerun this
only to change the seeds). Each file is written from the format's documentation, not by the
C code: safetensors as test/sh/stedit.py and our writer lay it out (compact JSON header padded
with spaces to 8 bytes, "__metadata__" first with "crc32" and "crc32.NAME"), token files by
dpc-tokens(5), manifests as dpc-shard split writes them. The configs are copied from configs/. Not written
here: tokfile*/prepared.tok, the train.tok of `dpc-shard prepare --val-frac 0.34
--router-frac 0` on three short JSON Lines documents (our writer's own output, a version 1
file); spm/unigram.model and spm/bpe.model, `dpc-shard tokenizer train --vocab 300` (and
--type bpe) on test/sh/corpus.sh's make_corpus of 100 documents and one of accented and CJK
text (SentencePiece's own format, written by its trainer).
usage: python3 test/fuzz/mkseeds.py   (from the repository root)
"""
import json, os, shutil, struct, zlib

ROOT = "test/fuzz/corpus"


def out(harness, name, data):
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def safetensors(tensors, meta=None, crc=True):
    """tensors: [(name, dtype, shape, bytes)]"""
    hdr, md, body = {}, dict(meta or {}), b""
    for name, dtype, shape, data in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(data)]}
        if crc:
            md["crc32." + name] = "%08x" % zlib.crc32(data)
        body += data
    if crc:
        md["crc32"] = "%08x" % zlib.crc32(body)
    if md or crc:
        hdr = {"__metadata__": md, **hdr}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def tokfile(vocab, docs, version=2, kind=0, digest=0):
    """docs: [(tokens, meta_bytes)]; kind, digest: the tokenizer (version 2; version 1 has
    12 zero bytes there)"""
    width = 2 if vocab <= 65536 else 4
    toks = b"".join(struct.pack("<" + ("H" if width == 2 else "I") * len(t), *t) for t, _ in docs)
    toks += b"\0" * (-len(toks) % 8)
    offs, moffs, meta, n, m = [0], [0], b"", 0, 0
    for t, md in docs:
        n += len(t)
        m += len(md)
        offs.append(n)
        moffs.append(m)
        meta += md
    body = toks + struct.pack("<%dQ" % len(offs), *offs) + struct.pack("<%dQ" % len(moffs), *moffs) + meta
    h = b"DPCTOKS\0" + struct.pack("<IIQQIIQ", version, vocab, len(docs), n, width, zlib.crc32(body), len(meta))
    h += struct.pack("<IQ", kind, digest)
    h += struct.pack("<I", zlib.crc32(h))
    assert len(h) == 64
    return h + body


def main():
    for f in sorted(os.listdir("configs")):
        if f.endswith(".yaml"):
            os.makedirs(os.path.join(ROOT, "config"), exist_ok=True)
            shutil.copy(os.path.join("configs", f), os.path.join(ROOT, "config", f))

    # path sampling (dipaco.paths_per_phase): 8 paths of a 4 x 2 topology, 4 a phase
    out("config", "dipaco-sample.yaml",
        "model:\n  n_layer: 2\n  n_embd: 32\n  n_head: 2\n  seq_len: 32\n"
        "train:\n  steps: 90\n  seed: 5\n"
        "dipaco:\n  phases: 3\n  inner_steps: 30\n  paths_per_phase: 4\n"
        "levels:\n  - name: lower\n    owns: embed h.0\n    modules: 4\n"
        "  - name: upper\n    owns: h.1 head\n    modules: 2\n")
    out("override", "sample", "@levels\0dipaco.paths=8\0dipaco.paths_per_phase=3")
    out("override", "train", "train.lr=0.001\0train.steps=10\0train.warmup_steps=2\0train.seed=7")
    out("override", "model", "model.n_layer=2\0model.n_embd=64\0model.n_head=4\0model.seq_len=32")
    out("override", "levels", "@levels\0model.n_layer=4\0dipaco.paths=8\0dipaco.phases=2")
    out("override", "outer", "@levels\0dipaco.outer_lr=1\0dipaco.outer_momentum=0\0dipaco.nesterov=false"
        "\0dipaco.rescale=true\0dipaco.reweight=true\0dipaco.holdout_frac=0.1\0dipaco.early_stop_every=5")
    out("override", "numbers", "train.lr=3e-4\0train.eps=1.0e-8\0train.beta2=0.999\0train.grad_clip=0"
        "\0train.seed=18446744073709551615\0train.eval_every=0\0train.checkpoint_every=100")

    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    i64 = lambda *v: struct.pack("<%dq" % len(v), *v)
    st = {
        "two.safetensors": safetensors(
            [("wte.weight", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6)), ("step", "I64", [1], i64(42))],
            {"format": "pt", "config_hash": "0123456789abcdef"}),
        "dtypes.safetensors": safetensors(
            [("h", "F16", [4], b"\x00\x3c" * 4), ("b", "BF16", [2, 2], b"\x80\x3f" * 4),
             ("u8", "U8", [3], b"abc"), ("u16", "U16", [1], b"\x01\x02"), ("i32", "I32", [2], b"\xff" * 8),
             ("x", "F32", [1, 1, 1, 1], f32(0.5))]),
        "nocrc.safetensors": safetensors([("a", "F32", [2], f32(1, -1))], crc=False),
        "empty.safetensors": safetensors([]),
        "zero.safetensors": safetensors([("z", "F32", [0, 4], b""), ("s", "F32", [], f32(7))]),
    }
    for harness in ("safetensors", "safetensors_crc"):
        for name, data in st.items():
            out(harness, name, data)

    tf = {
        "three.tok": tokfile(256, [([72, 105], b'{"id":1}'), ([], b'{"id":2,"src":"a"}'),
                                   ([1, 2, 3, 255], b'{"id":3}')]),
        "wide.tok": tokfile(70000, [([0, 69999, 65536], b'{"file":"x.txt"}'), ([5], b"{}")]),
        "empty.tok": tokfile(50257, []),
        "nometa.tok": tokfile(3, [([0, 1, 2], b""), ([2], b'{"k":[1,2]}')]),
        "byte.tok": tokfile(256, [([104, 105], b'{"id":1}')], kind=1),
        "spm.tok": tokfile(4096, [([5, 4095, 17], b'{"id":1}'), ([9], b"{}")], kind=2,
                           digest=0x8d2f6a1c00c41bf3),
        "v1.tok": tokfile(256, [([72, 105], b'{"id":1}')], version=1),
    }
    for harness in ("tokfile", "tokfile_crc"):
        for name, data in tf.items():
            out(harness, name, data)

    out("trace", "simple", "1\n1.25\n2\n")
    out("trace", "comments", "# capacity per step\n\n1.0\n  0.5  \n# done\n2e0\n")
    out("trace", "crlf", "1\r\n-2\r\n0x1p-2\r\n")
    out("trace", "nolf", "# last line without a newline\n3.5")

    out("corpus", "docs.jsonl", '{"text":"Hello world.","id":1}\n\n{"id":2,"text":"caf\\u00e9 \\ud83d\\ude00"}\n'
        '{"text":"","src":{"a":[1,2.5,null,true]}}\n')
    out("corpus", "nul.jsonl", '{"text":"a\\u0000b","k":"v\\u0000w"}\n   \n\t\n{"text":"x"}')
    out("corpus", "crlf.jsonl", '{"text":"one"}\r\n{"text":"two","n":-1e3}\r\n')

    def manifest(tokens, paths=None):
        sh = [{"file": "shard-%03d.tok" % i, "docs": 1, "tokens": t} for i, t in enumerate(tokens)]
        return json.dumps({"source": "data/brown/train.tok", "source_crc": "1234abcd", "method": "random",
                           "seed": 1, "paths": len(tokens) if paths is None else paths, "shards": sh}, indent=2) + "\n"
    out("manifest", "four.json", manifest([100, 2, 3000, 7]))
    out("manifest", "two.json", manifest([100, 200]))
    out("manifest", "few-tokens.json", manifest([100, 1, 5, 5]))
    wrong = json.loads(manifest([100, 2, 3000, 7]))
    wrong["shards"][2]["file"] = "shard-2.tok"
    out("manifest", "wrong-name.json", json.dumps(wrong, indent=2) + "\n")

    moedict()
    tutel()


def tutel():
    """A layer in Tutel's state-dict names (lib/moe/moe_tutel.h) of E 2, M 4, H 6, as the
    harness loads it: with our crc keys, as Tutel's safetensors would write it (none), and
    near misses."""
    E, M, H = 2, 4, 6
    f32 = lambda n, a=0.25: struct.pack("<%df" % n, *[a * (i - n / 2) for i in range(n)])
    ts = [("gates.0.wg.weight", "F32", [E, M], f32(E * M)),
          ("experts.batched_fc1_w", "F32", [E, H, M], f32(E * H * M)),
          ("experts.batched_fc1_bias", "F32", [E, H], f32(E * H, 0.5)),
          ("experts.batched_fc2_w", "F32", [E, H, M], f32(E * H * M, -0.125)),
          ("experts.batched_fc2_bias", "F32", [E, M], f32(E * M, 2.0)),
          ("_num_global_experts", "I64", [], struct.pack("<q", E))]
    meta = {"format": "tutel-moe-layer", "experts": "2", "model_dim": "4", "hidden_dim": "6"}
    out("tutel", "layer.safetensors", safetensors(ts, meta))
    out("tutel", "tutel.safetensors", safetensors(ts, crc=False))
    step = [("moe_bench.input", "F32", [3, M], f32(3 * M)), ("moe_bench.output", "F32", [3, M], f32(3 * M))]
    out("tutel", "step.safetensors", safetensors(ts + step, meta))
    out("tutel", "miss-experts.safetensors", safetensors(ts[:5] + [(ts[5][0], "I64", [], struct.pack("<q", 3))]))
    out("tutel", "miss-shape.safetensors", safetensors([(ts[0][0], "F32", [M, E], ts[0][3])] + ts[1:]))
    out("tutel", "miss-tensor.safetensors", safetensors(ts[:2] + ts[3:]))
    out("tutel", "miss-dtype.safetensors", safetensors(ts[:4] + [(ts[4][0], "F64", [E, M // 2], ts[4][3])] + ts[5:]))


def moedict():
    """Strategy dictionaries by moe-dict(5): valid files and near misses."""
    head = ("moe-dict 1\n# Tutel strategy dictionary, see moe-dict(5)\n"
            "machine AMD EPYC 9654 96-Core Processor, 2 sockets, host node-07\n"
            "world 8\nlocal-size 4\nexperts 16\nmodel-dim 1024\nhidden-dim 4096\ntop-k 2\n"
            "tokens 8192\nwindow 128\n# bucket KEY r d a SECONDS\n")
    out("moedict", "profile.txt", head +
        "bucket 0 0 1 linear 0.0012345678901234567\nbucket 1 1 2 2dh 0.0023\n"
        "bucket 2 1 4 2dh 0.0041000000000000003\nbucket 4 1 8 mpi 0.0079\n"
        "bucket 8 1 8 linear 0.015625\n")
    out("moedict", "one.txt", "moe-dict 1\nmachine x\nworld 1\nlocal-size 1\nexperts 1\n"
        "model-dim 1\nhidden-dim 1\ntop-k 1\ntokens 1\nwindow 1\nbucket 0 0 1 linear 1")
    out("moedict", "loose.txt", "moe-dict\t1  # magic\n\n  # comments and blanks\n"
        "\tmachine \t caf\u00e9\tbox  # trailing\nwindow 9007199254740992\ntokens 3\n"
        "top-k 4\nhidden-dim 6\nmodel-dim 2\nexperts 4\nlocal-size 2\nworld 2\n"
        "bucket 9007199254740991 2147483647 2 mpi 4.9406564584124654e-324\n"
        "  bucket 9007199254740992 0 8 linear +1.7976931348623157E308   # edge\n")
    # near misses: each breaks one rule
    out("moedict", "miss-order.txt", head + "bucket 5 1 1 linear 1\nbucket 3 1 1 linear 1\n")
    out("moedict", "miss-key.txt", head.replace("world 8", "wolrd 8") + "bucket 0 1 1 linear 1\n")
    out("moedict", "miss-version.txt", head.replace("moe-dict 1", "moe-dict 2"))
    out("moedict", "miss-seconds.txt", head + "bucket 0 1 1 linear 0x1p-3\nbucket 1 1 1 mpi inf\n")
    out("moedict", "miss-plan.txt", head + "bucket 0 1 3 ring 1e-3\n")
    out("moedict", "miss-crlf.txt", head.replace("\n", "\r\n") + "bucket 0 1 1 linear 1\r\n")
    out("moedict", "miss-control.txt", head.replace("host node-07", "host\x1b[2Jnode\x00")
        + "bucket 0 1 1 linear 1\n")
    out("moedict", "miss-divide.txt", head.replace("local-size 4", "local-size 3")
        + "bucket 0 1 1 linear 1\n")


if __name__ == "__main__":
    main()
