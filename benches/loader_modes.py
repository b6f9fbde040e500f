"""How prep.torch's ways of reading compare on one host (issue 31): worker processes against
prep's own threads in the main process, for CPU batches and for batches on the GPU.

    python3 benches/loader_modes.py PREP_DATASET [--epochs 3] [--batch 256]

Each mode reads shuffled epochs of the dataset's train split through prep.torch.DataLoader and
prints, per epoch, samples/s (from creating the iterator to the last batch, so the workers'
start counts), the time to the first batch, and the CPU time a batch of the worker processes
and of this process. Modes: 8 and 16 workers (one Rust thread each, the default), 0 workers with
8, 15 and all cores' threads, and, where CUDA is available, device="cuda" with 8 workers (the
shared-memory ring) and with 0 workers (pinned batches copied on the current stream).
"""

import argparse
import resource
import time

import torch

import prep.torch as pt


def run(a, label, workers, threads=None, device=None):
    rates = []
    for e in range(a.epochs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s0 = resource.getrusage(resource.RUSAGE_SELF)
        ds = pt.ShardDataset(a.data, "train", batch_size=a.batch, shuffle=True, seed=0,
                             threads=threads)
        ds.set_epoch(e)
        t = time.perf_counter()
        n, first = 0, None
        for x, _ in pt.DataLoader(ds, num_workers=workers, device=device):
            if first is None:
                first = time.perf_counter() - t
            n += x.shape[0]
        if device:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        s1 = resource.getrusage(resource.RUSAGE_SELF)
        nb = n / a.batch
        wc = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1e3 / nb
        mc = (s1.ru_utime - s0.ru_utime + s1.ru_stime - s0.ru_stime) * 1e3 / nb
        rates.append(n / dt)
        print(f"  {label:30} epoch {e}: {n / dt:9,.0f} samples/s  1st batch {first * 1e3:6.1f} ms  "
              f"workers cpu {wc:5.2f} ms/batch  main cpu {mc:5.2f} ms/batch", flush=True)
    print(f"{label:32} best {max(rates):,.0f} samples/s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    run(a, "8 workers", 8)
    run(a, "16 workers", 16)
    run(a, "0 workers, all cores' threads", 0)
    run(a, "0 workers, 8 threads", 0, threads=8)
    run(a, "0 workers, 15 threads", 0, threads=15)
    if torch.cuda.is_available():
        run(a, "cuda: 8 workers (ring)", 8, device="cuda")
        run(a, "cuda: 0 workers", 0, device="cuda")


if __name__ == "__main__":
    main()
