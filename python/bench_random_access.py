"""Random access through the prep package against a NumPy memmap of the same samples.

    python python/bench_random_access.py DATASET [--split train] [--n 100000] [--memmap PATH]

Writes DATASET's split once as an uncompressed .npy (images) and .labels.npy (the memmap, read
through the package in file order) unless it exists, then times, on the same random indices
(uniform, with repeats, fixed seed):

- ``split[i]`` one sample at a time (reads and checks only the block holding ``i``; a bounded
  cache of decoded blocks), against ``np.array(images[i])`` from the memmap (a copy, as a
  loader makes);
- ``split.take(indices)`` in one call (each block read and checked once, on every core),
  against ``images[indices]`` (NumPy fancy indexing of the memmap).

Both sides read from the page cache when the files fit in RAM (say so when reporting). Checks
that every sample read equals the memmap's. Prints one JSON line.
"""

import argparse
import json
import os
import platform
import time

import numpy as np

import prep


def write_memmap(split, path):
    images = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=split.dtype,
                                       shape=(len(split),) + split.shape)
    labels = np.empty(len(split), dtype=np.int64)
    at = 0
    for x, y in split.batches(8192, shuffle=False):
        images[at:at + len(y)] = x
        labels[at:at + len(y)] = y
        at += len(y)
    assert at == len(split)
    images.flush()
    del images
    np.save(path + ".labels.npy", labels)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--split", default="train")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memmap", help="the .npy to compare with (default: DATASET.<split>.npy)")
    ap.add_argument("--cache-mib", type=int, default=prep.DEFAULT_CACHE_BYTES >> 20)
    a = ap.parse_args()
    mm_path = a.memmap or os.path.normpath(a.dataset) + f".{a.split}.npy"

    ds = prep.open(a.dataset, cache_bytes=a.cache_mib << 20)
    split = ds[a.split]
    if not os.path.exists(mm_path):
        t = time.perf_counter()
        write_memmap(split, mm_path)
        print(f"wrote {mm_path} in {time.perf_counter() - t:.1f} s", flush=True)
    images = np.load(mm_path, mmap_mode="r")
    labels = np.load(mm_path + ".labels.npy", mmap_mode="r")
    assert images.shape == (len(split),) + split.shape, (images.shape, split.shape)
    idx = np.random.default_rng(a.seed).integers(0, len(split), a.n)
    idx_list = idx.tolist()
    out = {"dataset": a.dataset, "split": a.split, "samples": len(split),
           "shape": "x".join(map(str, split.shape)), "dtype": str(split.dtype),
           "blocks": split.num_blocks, "block_samples": ds.block_samples,
           "indices": a.n, "cache_mib": a.cache_mib, "cores": os.cpu_count(),
           "machine": platform.node()}

    # Warm both sides' files into the page cache the same way (a sequential read).
    for _ in split.batches(8192, shuffle=False):
        pass
    np.asarray(images).sum(dtype=np.uint64) if images.dtype == np.uint8 else None

    # One sample at a time.
    t = time.perf_counter()
    got = [split[i] for i in idx_list]
    dt = time.perf_counter() - t
    out["prep_getitem_samples_per_s"] = round(a.n / dt, 1)
    out["prep_getitem_cache"] = split.cache_info()
    t = time.perf_counter()
    ref = [(np.array(images[i]), int(labels[i])) for i in idx_list]
    dt = time.perf_counter() - t
    out["memmap_getitem_samples_per_s"] = round(a.n / dt, 1)
    for (x, y), (rx, ry) in zip(got, ref):
        assert y == ry and np.array_equal(x, rx), "prep and the memmap disagree"
    del got, ref

    # All indices in one call.
    t = time.perf_counter()
    x, y = split.take(idx)
    dt = time.perf_counter() - t
    out["prep_take_samples_per_s"] = round(a.n / dt, 1)
    t = time.perf_counter()
    rx, ry = images[idx], labels[idx]
    dt = time.perf_counter() - t
    out["memmap_fancy_index_samples_per_s"] = round(a.n / dt, 1)
    assert np.array_equal(x, rx) and np.array_equal(y, ry), "prep and the memmap disagree"

    out["getitem_ratio_prep_over_memmap"] = round(
        out["prep_getitem_samples_per_s"] / out["memmap_getitem_samples_per_s"], 5)
    out["take_ratio_prep_over_memmap"] = round(
        out["prep_take_samples_per_s"] / out["memmap_fancy_index_samples_per_s"], 4)
    out["bytes_on_disk"] = {
        "prep": sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.dataset)
                    for f in fs),
        "memmap": os.path.getsize(mm_path),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
