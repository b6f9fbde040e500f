"""The Python reader from a store against local disk (issue 30): shuffled epochs of
``prep.open(SRC)["train"].batches(...)`` for each source, samples/s, MB/s of stored bytes, and
the epoch's requests and bytes from the store (``prep.store_traffic``).

    python3 benches/py_store.py /data/ds s3://bench/ds http://127.0.0.1:8080/ds --epochs 2

Each source is one dataset (the same one, copied or served): the first is the reference the
others are given as ratios of. Prints one JSON line per source and epoch.
"""

import argparse
import json
import time

import prep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    ref = None
    for src in a.sources:
        ds = prep.open(src)
        split = ds["train"]
        stored = sum(s["bytes"] for s in ds.manifest["splits"]["train"]["shards"])
        rates = []
        for epoch in range(a.epochs):
            seen, n, t0 = prep.store_traffic(), 0, time.perf_counter()
            for batch in split.batches(a.batch, seed=0, epoch=epoch, threads=a.threads):
                n += len(batch[1] if isinstance(batch, tuple) else batch["class"])
            dt = time.perf_counter() - t0
            rates.append(n / dt)
            print(json.dumps({"source": src, "epoch": epoch + 1, "samples": n,
                              "samples_per_sec": round(n / dt, 1),
                              "stored_mb_per_sec": round(stored / dt / 1e6, 1),
                              "requests": prep.store_traffic()["requests"] - seen["requests"],
                              "bytes": prep.store_traffic()["bytes"] - seen["bytes"]}), flush=True)
        best = max(rates)
        if ref is None:
            ref = best
        print(json.dumps({"source": src, "best_samples_per_sec": round(best, 1),
                          "ratio_to_first": round(best / ref, 3)}), flush=True)


if __name__ == "__main__":
    main()
