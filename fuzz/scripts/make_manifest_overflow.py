#!/usr/bin/env python3
"""Write the smallest manifest.json that Manifest::from_bytes accepts (valid self-checksum; class
counts and shard samples add up) but for which Manifest::raw_bytes() overflows u64:
2^62 samples of 1x1x4 u8 (4 bytes each). Made
fuzz/regressions/manifest-panic-raw-bytes-mul-overflow.json.

usage: make_manifest_overflow.py OUT
"""
import json, sys, xxhash

n = 1 << 62
m = {"format": "prep-shards", "version": 1, "sample": {"shape": [1, 1, 4], "dtype": "u8"},
     "classes": ["a"], "codec": {"name": "none"}, "block_samples": 1, "mean": [0], "std": [0],
     "splits": {"a": {"samples": n, "class_counts": [n], "mean": [0], "std": [0],
                      "shards": [{"file": "a", "samples": n, "blocks": 1, "bytes": 1,
                                  "footer_xxh3": ""}]}},
     "provenance": {"tool": "", "command": [], "source": None}, "checksum": "0" * 16}
b = (json.dumps(m, separators=(",", ": ")) + "\n").encode()
key = b'"checksum": "'
p = b.rindex(key) + len(key)
b = b[:p] + format(xxhash.xxh3_64_intdigest(b), "016x").encode() + b[p + 16:]
open(sys.argv[1], "wb").write(b)
print(f"{sys.argv[1]}: {len(b)} bytes")
