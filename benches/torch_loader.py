"""PyTorch training fed by prep's Python package, against the same loop with the data already on
the GPU and against a standard DataLoader over a NumPy memmap (issue 13, acceptance 2).

    prep synth --train 1000000 --test 10000 --shape 3x32x32 --out /tmp/ds1m
    python3 benches/torch_loader.py /tmp/ds1m --workers 8 --batch 512

One training loop (the `small` model of benches/torch_train.py, bf16 autocast, channels-last,
cudnn.benchmark, SGD with Nesterov momentum, label smoothing 0.1; each step normalises a uint8
batch on the GPU) is fed three ways:

  (a) prep:   prep.torch.ShardDataset through prep.torch.DataLoader with --workers workers and
              device="cuda" (the workers fill a page-locked ring in shared memory, batches
              arrive on the GPU): prep train's order, every block checked;
  (a'') prep-shared: (a) with reserve_core=False: the workers may run on the core of the
              thread that launches the steps (for comparison; not a default);
  (a''') prep-poll: (a) with the workers polling for a free slot every 0.2 ms (prep.torch
              before its naps lengthened up to 2 ms; for comparison);
  (a') prep-pinned: the same with pinned CPU tensors (pin_memory=True, the DataLoader's
              own pinning thread) copied by the loop, as a torch DataLoader is usually used;
  (b) device: the whole split in GPU memory, batches gathered there by a random permutation
              (as benches/torch_train.py does): the ceiling for any loader;
  (c) memmap: torch.utils.data.DataLoader (shuffle, --workers workers, pinned memory) over a
              map-style Dataset reading samples from a NumPy memmap of the same samples (written
              from the dataset once, next to it, unless it exists).

samples/s counts the steps after --warmup steps, to the end of the epoch or --steps steps; the
modes take turns for --rounds rounds and each mode's figure is the median of its rounds. Host
memory: the peak, over the run of each mode, of the proportional set size (PSS: shared pages
divided among the processes sharing them, so forked workers are not counted twice) of this
process and its DataLoader workers, sampled every 50 ms; and this process's peak RSS. Prints one
JSON line per mode and a summary line with the ratio (a)/(b) (the issue asks for at least 0.95).
"""

import argparse
import json
import os
import resource
import statistics
import threading
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import prep
import prep.torch as pt


def small(c, classes):
    """`small` as prep defines it (src/nn/model.rs); the same as benches/torch_train.py."""
    layers, cin = [], c
    for i, w in enumerate([32, 64, 128]):
        layers += [nn.Conv2d(cin, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
        if i < 2:
            layers.append(nn.MaxPool2d(2))
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes)]
    return nn.Sequential(*layers)


# -- host memory ---------------------------------------------------------------------------------


def _children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _pss(pid):
    """PSS of a process in bytes (RSS where smaps_rollup is missing)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemoryWatch:
    """Peak PSS of this process tree, sampled on a thread."""

    def __init__(self, every=0.05):
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            todo, total, seen = [os.getpid()], 0, set()
            while todo:
                p = todo.pop()
                if p in seen:
                    continue
                seen.add(p)
                total += _pss(p)
                todo += _children(p)
            self.peak = max(self.peak, total)
            self._stop.wait(self.every)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


# -- the loop ------------------------------------------------------------------------------------


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


class Trainer:
    def __init__(self, dev, c, classes, mean, std, lr=0.1):
        self.dev = dev
        torch.manual_seed(0)
        self.model = small(c, classes).to(self.dev).to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                                   weight_decay=5e-4)
        self.mean = torch.tensor(mean, device=self.dev).view(1, c, 1, 1)
        self.std = torch.tensor(std, device=self.dev).view(1, c, 1, 1)
        self.model.train()

    def step(self, x_u8, y):
        """One step on a uint8 batch already on the GPU."""
        x = x_u8.float().div_(255).sub_(self.mean).div_(self.std).contiguous(
            memory_format=torch.channels_last)
        with torch.autocast(self.dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(x), y, label_smoothing=0.1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss


def timed(batches, trainer, warmup, steps, to_device):
    """Train on `batches` (an iterable of (x, y)); samples/s over the steps after `warmup`."""
    n = samples = 0
    t0 = None
    start = time.perf_counter()
    loss = None
    # Host time of the launching thread per timed step: getting the next batch, and the step.
    t_next = t_step = 0.0
    it = iter(batches)
    while True:
        a = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        b = time.perf_counter()
        if n == warmup:
            sync(trainer.dev)
            t0 = time.perf_counter()
        if to_device:
            x = x.to(trainer.dev, non_blocking=True)
            y = y.to(trainer.dev, non_blocking=True)
        loss = trainer.step(x, y)
        if n >= warmup:
            samples += y.shape[0]
            t_next += b - a
            t_step += time.perf_counter() - b
        n += 1
        if n >= warmup + steps:
            break
    sync(trainer.dev)
    end = time.perf_counter()
    if t0 is None:
        raise SystemExit(f"only {n} batches: fewer than --warmup {warmup}")
    k = max(n - warmup, 1)
    return {"steps": n - warmup, "samples": samples,
            "samples_per_sec": round(samples / (end - t0), 1),
            "host_ms_next": round(1e3 * t_next / k, 4), "host_ms_step": round(1e3 * t_step / k, 4),
            "wall_s_with_startup": round(end - start, 2), "loss": float(loss.detach())}


# -- the three feeds -----------------------------------------------------------------------------


def feed_prep(a, epoch, on_device, reserve_core=True):
    cuda = a.device == "cuda"
    data = pt.ShardDataset(a.data, "train", batch_size=a.batch, seed=0, drop_last=True,
                           pin_memory=cuda and not on_device, threads=a.threads)
    data.set_epoch(epoch)
    extra = {"prefetch_factor": a.prefetch} if a.workers > 0 else {}  # refused without workers
    if on_device and cuda:
        extra["device"] = a.device
        extra["reserve_core"] = reserve_core
    loader = pt.DataLoader(data, num_workers=a.workers, **extra)
    return loader


def load_on_device(split, dev):
    n = len(split)
    x = torch.empty((n,) + split.shape, dtype=torch.uint8, device=dev)
    y = torch.empty(n, dtype=torch.int64, device=dev)
    at = 0
    for xb, yb in split.batches(16384, shuffle=False):
        k = len(yb)
        x[at:at + k].copy_(torch.from_numpy(xb))
        y[at:at + k].copy_(torch.from_numpy(yb))
        at += k
    assert at == n
    return x, y


def feed_device(x, y, batch, epoch):
    g = torch.Generator(device=x.device)
    g.manual_seed(epoch)
    perm = torch.randperm(len(y), device=x.device, generator=g)
    for i in range(len(y) // batch):
        idx = perm[i * batch:(i + 1) * batch]
        yield x[idx], y[idx]


class MemmapDataset(torch.utils.data.Dataset):
    """The usual way: one sample per __getitem__ from a memmap, the default collate."""

    def __init__(self, path):
        self.path = path
        self.images = None
        self.n = len(np.load(path + ".labels.npy", mmap_mode="r"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.images is None:  # opened in each worker
            self.images = np.load(self.path, mmap_mode="r")
            self.labels = np.load(self.path + ".labels.npy", mmap_mode="r")
        return torch.from_numpy(np.array(self.images[i])), int(self.labels[i])


def write_memmap(split, path):
    images = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=np.uint8,
                                       shape=(len(split),) + split.shape)
    labels = np.empty(len(split), dtype=np.int64)
    at = 0
    for x, y in split.batches(16384, shuffle=False):
        images[at:at + len(y)] = x
        labels[at:at + len(y)] = y
        at += len(y)
    images.flush()
    del images
    np.save(path + ".labels.npy", labels)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a prep dataset with a uint8 train split")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--threads", type=int, default=None,
                    help="prep's Rust threads per process (default: prep.torch's, one per worker)")
    ap.add_argument("--prefetch", type=int, default=4, help="DataLoader prefetch_factor")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10**9, help="at most this many timed steps")
    ap.add_argument("--memmap-steps", type=int, default=400,
                    help="timed steps of (c), which is slow (0: skip it)")
    ap.add_argument("--memmap", help="the .npy for (c) (default: DATA.train.npy)")
    ap.add_argument("--modes", default="device,prep,prep-pinned,memmap")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script only")
    ap.add_argument("--rounds", type=int, default=3,
                    help="each mode runs this many times, the modes taking turns (memmap once)")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True

    ds = prep.open(a.data)
    split = ds["train"]
    assert ds.dtype == np.uint8, "this bench normalises uint8 data"
    c = ds.shape[0]
    trainer = Trainer(torch.device(a.device), c, ds.num_classes, ds.mean, ds.std)
    per_epoch = len(split) // a.batch
    steps = min(a.steps, per_epoch - a.warmup)
    info = {"gpu": torch.cuda.get_device_name() if a.device == "cuda" else "none (cpu)", "torch": torch.__version__,
            "prep": prep.__version__, "samples": len(split), "shape": list(ds.shape),
            "batch": a.batch, "workers": a.workers, "cores": os.cpu_count(),
            "timed_steps": steps, "warmup": a.warmup}
    print(json.dumps(info), flush=True)
    modes = a.modes.split(",")
    x = y = None
    if "device" in modes:
        x, y = load_on_device(split, trainer.dev)
    memmap = None
    if "memmap" in modes and a.memmap_steps > 0:
        memmap = a.memmap or os.path.normpath(a.data) + ".train.npy"
        if not os.path.exists(memmap):
            t = time.perf_counter()
            write_memmap(split, memmap)
            print(json.dumps({"wrote": memmap, "s": round(time.perf_counter() - t, 1)}), flush=True)

    def run(mode, epoch):
        if mode == "device":
            return timed(feed_device(x, y, a.batch, epoch), trainer, a.warmup, steps, False)
        if mode == "prep-poll":
            # (a) with the workers waiting for a free slot as before 2026-11-24: a 0.2 ms nap,
            # never longer (forked workers take the module's values with them).
            naps = pt._FIRST_NAP, pt._MAX_NAP
            pt._FIRST_NAP = pt._MAX_NAP = 0.0002
            try:
                return run("prep", epoch)
            finally:
                pt._FIRST_NAP, pt._MAX_NAP = naps
        if mode in ("prep", "prep-shared", "prep-pinned"):
            loader = feed_prep(a, epoch, mode != "prep-pinned", mode != "prep-shared")
            assert len(loader) == per_epoch, (len(loader), per_epoch)
            return timed(loader, trainer, a.warmup, steps, True)
        if mode == "memmap":
            loader = torch.utils.data.DataLoader(
                MemmapDataset(memmap), batch_size=a.batch, shuffle=True, drop_last=True,
                num_workers=a.workers, pin_memory=a.device == "cuda", prefetch_factor=a.prefetch)
            return timed(loader, trainer, a.warmup, min(steps, a.memmap_steps), True)
        raise SystemExit(f"unknown mode {mode}")

    # The modes take turns, round after round (the loop's speed drifts by several percent from
    # one minute to the next on a shared host); each mode's figure is the median of its rounds.
    runs = {m: [] for m in modes if m != "memmap" or memmap}
    for rnd in range(a.rounds):
        for mode in runs:
            if mode == "memmap" and rnd > 0:
                continue  # slow and not compared to a goal: one round
            with MemoryWatch() as mw:
                r = run(mode, rnd)
            r.update(mode=mode, round=rnd, peak_tree_pss_bytes=mw.peak)
            runs[mode].append(r)
            print(json.dumps(r), flush=True)
    if x is not None:
        del x, y

    summary = {"summary": True, "rounds": a.rounds,
               "peak_rss_main_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "peak_rss_largest_child_bytes":
                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
    for k, rs in runs.items():
        summary[f"{k}_samples_per_sec"] = statistics.median(r["samples_per_sec"] for r in rs)
        for h in ("host_ms_next", "host_ms_step"):
            summary[f"{k}_{h}"] = round(statistics.median(r[h] for r in rs), 4)
        summary[f"{k}_peak_tree_pss_bytes"] = max(r["peak_tree_pss_bytes"] for r in rs)
    if "device" in runs:
        dev = summary["device_samples_per_sec"]
        for k in runs:
            if k != "device":
                summary[f"{k}_over_device"] = round(summary[f"{k}_samples_per_sec"] / dev, 4)
                # Each round against the device run just before it.
                summary[f"{k}_over_device_by_round"] = [
                    round(r["samples_per_sec"] / d["samples_per_sec"], 4)
                    for r, d in zip(runs[k], runs["device"])]
                summary[f"{k}_over_device_median_of_rounds"] = round(
                    statistics.median(summary[f"{k}_over_device_by_round"]), 4)
        if "prep" in runs:
            summary["goal_0.95"] = "met" if summary["prep_over_device"] >= 0.95 else "not met"
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
