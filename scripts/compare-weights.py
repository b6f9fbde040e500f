#!/usr/bin/env python3
"""Compare the weights of two prep checkpoints (safetensors, float32), for scripts/gpu-check.sh.

    compare-weights.py A/checkpoint.safetensors B/checkpoint.safetensors [--rtol R]

Compares the trained tensors (not momentum; BN running statistics only with --running, since
they stay per rank in a data-parallel run). Prints one JSON line: the largest difference relative
to the tensor's largest magnitude, and the tensor it is in. Exit 0 when it is at most --rtol,
1 when above, 2 when the files do not hold the same tensors. Standard library only.
"""
import argparse, json, struct, sys
from array import array


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        v = array("f")
        v.frombytes(data[a:b])
        if sys.byteorder != "little":
            v.byteswap()
        out[name] = v
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--running", action="store_true")
    o = p.parse_args()
    x, y = load(o.a), load(o.b)
    keep = lambda k: not k.endswith(".momentum") and (o.running or not ("running" in k))
    names = sorted(k for k in x if keep(k))
    if names != sorted(k for k in y if keep(k)):
        print(json.dumps({"error": "the checkpoints hold different tensors"}))
        return 2
    worst, where = 0.0, ""
    for k in names:
        a, b = x[k], y[k]
        if len(a) != len(b):
            print(json.dumps({"error": f"{k}: {len(a)} values against {len(b)}"}))
            return 2
        scale = max(max((abs(v) for v in a), default=0.0), 1e-12)
        d = max((abs(u - v) for u, v in zip(a, b)), default=0.0) / scale
        if d > worst or d != d:
            worst, where = d, k
    print(json.dumps({"max_relative_difference": worst, "tensor": where, "tensors": len(names), "rtol": o.rtol}))
    return 0 if worst <= o.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
