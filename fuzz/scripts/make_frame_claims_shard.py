#!/usr/bin/env python3
"""Write a small, well-formed (every checksum valid) shard whose one zstd block is only a zstd frame
header (13 bytes, no data blocks) declaring Frame_Content_Size = the block's decoded size, the
largest the reader accepts (MAX_BLOCK_RAW = 2^30 since 3783831).

The frame-size check added in 3783831 passes (the declared size equals the index's), and
zstd::bulk::decompress(stored, raw) then reserves `raw` bytes before finding that the frame has no
data. Made fuzz/regressions/shard_reader-alloc-1gib-zstd-frame-header-only.shard.

usage: make_frame_claims_shard.py OUT
"""
import struct, sys, xxhash

def h(b):
    return xxhash.xxh3_64_intdigest(b)

out = sys.argv[1]
n = 2
# u16 samples of 1 x 2 x (2^27 - 1): S = 2^29 - 4 bytes (the cap is 2^29), so one block of 2
# samples decodes to 2 * (S + 4) = 2^30 bytes = MAX_BLOCK_RAW.
dims = [1, 2, (1 << 27) - 1, 0]
S = 2 * dims[0] * dims[1] * dims[2]
raw = n * (S + 4)
assert raw == 1 << 30, raw
hdr = bytearray(64)
hdr[0:8] = b"PREPSHRD"
struct.pack_into("<HBBB", hdr, 8, 1, 2, 1, 3)       # version 1, dtype u16, codec zstd, ndim 3
struct.pack_into("<4I", hdr, 16, *dims)
struct.pack_into("<QII", hdr, 32, n, 1, 1)          # num_samples, num_blocks, num_classes
struct.pack_into("<Q", hdr, 56, h(bytes(hdr[:56])))
# zstd frame header: magic, descriptor 0xE0 (8-byte content size, single segment), content size.
block = struct.pack("<IBQ", 0xFD2FB528, 0xE0, raw)
footer = struct.pack("<QQIIQQ", 64, len(block), n, 0, h(block), 0)
footer += struct.pack("<Q", n)                       # class_counts[0] = n
footer += bytes(32)                                  # channel_sum[0], channel_sumsq[0] (u128)
footer_offset = 64 + len(block)
trailer = struct.pack("<QQQ", footer_offset, len(footer), h(footer)) + b"PREPEND\0"
data = bytes(hdr) + block + footer + trailer
open(out, "wb").write(data)
print(f"{out}: {len(data)} bytes, block 0: {len(block)} stored bytes declaring {raw} decoded bytes")
