"""Where the peer table's ceiling comes from (issue 31): the same 8-worker DataLoader epochs of
[256, 3, S, S] uint8 batches, three ways, in one process on one host.

    python3 benches/loader_ceiling.py PREP_DATASET [--epochs 4]

  (a) empty: a torch DataLoader whose IterableDataset yields one preallocated batch again and
      again, as many as the dataset has: no reading at all, only the transfer of CPU batches from
      8 worker processes (the floor every peer's CPU row pays);
  (b) prep CPU: prep.torch.ShardDataset through prep.torch.DataLoader, CPU batches (the table's row);
  (c) prep cuda: the same with device="cuda" (the workers fill a page-locked ring, batches arrive on
      the GPU), synchronised at the end of each epoch.
Prints samples/s of each epoch and the best of each way.
"""

import argparse
import time

import torch

import prep
import prep.torch as pt


class Same(torch.utils.data.IterableDataset):
    def __init__(self, n, shape):
        self.n, self.shape = n, shape

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info else (0, 1)
        x = torch.zeros(self.shape, dtype=torch.uint8)
        y = torch.zeros(self.shape[0], dtype=torch.int64)
        for i in range(w, self.n, k):
            yield x, y


def epochs(make, n_epochs, sync=False):
    rates = []
    for e in range(n_epochs):
        it = make(e)
        t = time.perf_counter()
        n = 0
        for x, _ in it:
            n += x.shape[0]
        if sync:
            torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - t))
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    split = prep.open(a.data)["train"]
    n, shape = len(split), (a.batch,) + tuple(prep.open(a.data).shape)
    batches = -(-n // a.batch)

    def empty(e):
        return iter(torch.utils.data.DataLoader(Same(batches, shape), batch_size=None, num_workers=a.workers))

    def prep_loader(device):
        def make(e):
            ds = pt.ShardDataset(a.data, "train", batch_size=a.batch, shuffle=True, seed=0)
            ds.set_epoch(e)
            return iter(pt.DataLoader(ds, num_workers=a.workers, device=device))
        return make

    for name, make, sync in [("empty", empty, False), ("prep cpu", prep_loader(None), False),
                             ("prep cuda", prep_loader("cuda"), True)]:
        r = epochs(make, a.epochs, sync)
        print(f"{name:10} {n} samples/epoch: " + ", ".join(f"{x:,.0f}" for x in r) + f"  best {max(r):,.0f} samples/s")


if __name__ == "__main__":
    main()
