#!/usr/bin/python3
"""Compare the tensors of two safetensors files, independently of the C code.
usage: stcmp.py A B   every tensor of A whose name has no '.momentum.' or 'optim.' prefix
                      must be in B with the same dtype, shape and bytes; prints the count
                      compared, exits 1 naming the first difference."""
import json, struct, sys

def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in hdr.items()}

a, b = load(sys.argv[1]), load(sys.argv[2])
count = 0
for name, (dt, shape, blob) in a.items():
    if name.startswith("optim.") or name.startswith("outer."):
        continue
    if name not in b:
        sys.exit("%s: tensor %s missing" % (sys.argv[2], name))
    if b[name][0] != dt or b[name][1] != shape:
        sys.exit("%s: %s is %s %s, expected %s %s" % (sys.argv[2], name, b[name][0], b[name][1], dt, shape))
    if b[name][2] != blob:
        sys.exit("tensor %s differs" % name)
    count += 1
print("%d tensors identical" % count)
