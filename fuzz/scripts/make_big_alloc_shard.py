#!/usr/bin/env python3
"""Write a small, well-formed (every checksum valid) shard whose one zstd block claims the largest
decoded size the reader accepts (MAX_BLOCK_RAW = 2^31 bytes), with 1 stored byte.

ShardReader::open accepts it; read_block(0) then reaches zstd::bulk::decompress(stored, 2^31), which
reserves a 2 GiB buffer before looking at the frame. Used to make
fuzz/regressions/shard_reader-oom-zstd-block-claims-2gib.shard.

usage: make_big_alloc_shard.py OUT [SAMPLES_IN_BLOCK]
"""
import struct, sys, xxhash

def h(b):
    return xxhash.xxh3_64_intdigest(b)

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
# u16 samples of 1 x 2 x (2^28 - 1): S = 2^30 - 4 bytes (largest the caps allow is 2^30),
# so one block of n = 2 samples decodes to n * (S + 4) = 2^31 bytes = MAX_BLOCK_RAW.
dims = [1, 2, (1 << 28) - 1, 0]
S = 2 * dims[0] * dims[1] * dims[2]
raw = n * (S + 4)
assert raw <= 1 << 31, raw
hdr = bytearray(64)
hdr[0:8] = b"PREPSHRD"
struct.pack_into("<HBBB", hdr, 8, 1, 2, 1, 3)       # version 1, dtype u16, codec zstd, ndim 3
struct.pack_into("<4I", hdr, 16, *dims)
struct.pack_into("<QII", hdr, 32, n, 1, 1)          # num_samples, num_blocks, num_classes
struct.pack_into("<Q", hdr, 56, h(bytes(hdr[:56])))
block = b"\x00"                                      # 1 stored byte (not a zstd frame)
footer = struct.pack("<QQIIQQ", 64, len(block), n, 0, h(block), 0)
footer += struct.pack("<Q", n)                       # class_counts[0] = n
footer += bytes(32)                                  # channel_sum[0], channel_sumsq[0] (u128)
footer_offset = 64 + len(block)
trailer = struct.pack("<QQQ", footer_offset, len(footer), h(footer)) + b"PREPEND\0"
data = bytes(hdr) + block + footer + trailer
open(out, "wb").write(data)
print(f"{out}: {len(data)} bytes, block 0 claims {raw} decoded bytes")
