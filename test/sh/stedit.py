#!/usr/bin/python3
"""Craft bad checkpoints for the shell tests, independently of the C code: rewrite a
safetensors file with one tensor changed, keeping the integrity metadata consistent so the
file passes checksum verification and only the intended defect remains.
usage: stedit.py IN OUT nan NAME          (first element of tensor NAME becomes NaN)
       stedit.py IN OUT reshape NAME R C  (tensor NAME declared and stored as [R, C] zeros)
       stedit.py IN OUT scale NAME K      (every element of float32 tensor NAME times K)
       stedit.py IN OUT params-only -     (the optim.* tensors and the optimizer key dropped:
                                           a checkpoint written without AdamW state)
       stedit.py IN OUT meta KEY VALUE    (metadata KEY set to VALUE, the tensors as they are)
"""
import json, struct, sys, zlib

src, dst, op, name = sys.argv[1:5]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = hdr.pop("__metadata__", {})
blobs = {k: bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in hdr.items()}
if op == "nan":
    blobs[name][0:4] = struct.pack("<f", float("nan"))
elif op == "scale":
    k = float(sys.argv[5])
    v = struct.unpack("<%df" % (len(blobs[name]) // 4), blobs[name])
    blobs[name] = bytearray(struct.pack("<%df" % len(v), *(x * k for x in v)))
elif op == "reshape":
    r, c = int(sys.argv[5]), int(sys.argv[6])
    hdr[name]["shape"] = [r, c]
    blobs[name] = bytearray(4 * r * c)
elif op == "params-only":
    for k in [k for k in hdr if k.startswith("optim.")]:
        del hdr[k], blobs[k]
        meta.pop("crc32." + k, None)
    meta.pop("optimizer", None)
elif op == "meta":
    meta[name] = sys.argv[5]
else:
    sys.exit("unknown op " + op)
out, off = bytearray(), 0
for k in hdr:
    b = blobs[k]
    hdr[k]["data_offsets"] = [off, off + len(b)]
    meta["crc32." + k] = "%08x" % zlib.crc32(b)
    out += b
    off += len(b)
meta["crc32"] = "%08x" % zlib.crc32(out)
hdr["__metadata__"] = meta
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + bytes(out))
