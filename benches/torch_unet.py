"""The PyTorch reference for `prep train --task mask --model unet`: the same U-Net, the same recipe,
the same data (read with the `prep` Python package into GPU memory, as `--memory device` holds it).

    python3 benches/torch_unet.py DATA --epochs 10 --batch 32            # train, test Dice, speed
    python3 benches/torch_unet.py DATA --speed-only --steps 60 --batch 32
    python3 -m torch.distributed.run --standalone --nproc_per_node 4 benches/torch_unet.py DATA \
        --speed-only --steps 60 --batch 32                                # PyTorch DDP, 4 GPUs

The model is prep's `unet` (src/nn/architecture.rs): five levels of w, 2w, 4w, 8w, 16w channels
(w = --width, 32), two conv3x3 (no bias) - BatchNorm - ReLU per level, 2x2 max-pool down; up: a
1x1 convolution halving the channels at the low resolution, nearest upsampling to the skip's size,
concatenation [skip, up], two conv3x3-BN-ReLU; a 1x1 head with bias. PyTorch eager: bf16
autocast, channels-last, cudnn.benchmark; SGD with Nesterov momentum 0.9, weight decay 5e-4 on
convolution weights (as prep: not on BN or biases), prep's one-cycle rate; loss per-pixel
cross-entropy + soft Dice over the foreground classes (eps 1) as prep computes it; prep's
augmentation: zero padding of round(min(H, W) / 12) after normalisation, a random crop back and
a flip, the mask padded with the ignored value, for the first nine tenths of the epochs.

Under torchrun (WORLD_SIZE set, --speed-only) it is PyTorch DDP as benches/torch_train.py runs
it: one process per GPU, the model in DistributedDataParallel (batch norm per rank), --batch per
GPU, each rank with the training split on its GPU; rank 0 prints the world's samples/s.

Prints JSON lines: one per epoch (loss, test mean Dice), then a summary with samples/s of the
training steps (after the first epoch, or of --steps timed steps with --speed-only), the test
per-class Dice and the peak GPU memory.
"""

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, c, classes, width=32):
        super().__init__()
        ws = [width * 2 ** i for i in range(5)]
        self.enc = nn.ModuleList()
        cin = c
        for w in ws:
            self.enc.append(block(cin, w))
            cin = w
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(ws[:-1]):
            self.up.append(nn.Conv2d(2 * w, w, 1, bias=False))
            self.dec.append(block(2 * w, w))
        self.head = nn.Conv2d(ws[0], classes, 1, bias=True)

    def forward(self, x):
        skips = []
        for i, e in enumerate(self.enc):
            x = e(x)
            if i < 4:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for up, dec in zip(self.up, self.dec):
            s = skips.pop()
            x = F.interpolate(up(x), size=s.shape[-2:], mode="nearest")
            x = dec(torch.cat([s, x], 1))
        return self.head(x)


def one_cycle(step, total, lr):
    """prep's schedule (src/train/schedule.rs)."""
    total = max(total, 1)
    warm = max(0.25 * total, 1.0)
    if step < warm:
        return lr * (0.04 + 0.96 * step / warm)
    return lr * max(1.0 - (step - warm) / max(total - warm, 1.0), 0.0)


def seg_loss(logits, target, k, dice_w=1.0, eps=1.0):
    """Per-pixel cross-entropy over counted pixels + dice_w * (1 - mean soft Dice of classes 1..k-1)."""
    logits = logits.float()
    valid = target >= 0
    ce = F.cross_entropy(logits, target.clamp(min=0), reduction="none")
    counted = valid.sum().clamp(min=1)
    ce = (ce * valid).sum() / counted
    p = logits.softmax(1) * valid.unsqueeze(1)
    g = F.one_hot(target.clamp(min=0), k).permute(0, 3, 1, 2).float() * valid.unsqueeze(1)
    inter = (p * g).sum((0, 2, 3))[1:]
    denom = (p.sum((0, 2, 3)) + g.sum((0, 2, 3)))[1:]
    dice = ((2 * inter + eps) / (denom + eps)).mean()
    return ce + dice_w * (1 - dice)


def load(path, split, dev):
    import prep

    ds = prep.open(path)
    s = ds[split]
    d = s.take(np.arange(len(s)))
    mask_field = [f for f in ds.fields if f["kind"] == "mask"][0]
    x = torch.from_numpy(np.ascontiguousarray(d["image"])).to(dev)
    y = torch.from_numpy(np.ascontiguousarray(d[mask_field["name"]]).astype(np.int64)).to(dev)
    return ds, x, y, mask_field


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    world, rank = int(os.environ.get("WORLD_SIZE", "0")), int(os.environ.get("RANK", "0"))
    if world:
        if not a.speed_only:
            raise SystemExit("under torchrun only --speed-only runs")
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cuda")
    torch.manual_seed(a.seed + rank)
    ds, xtr, ytr, mf = load(a.data, "train", dev)
    n, c, h, w = xtr.shape
    k = len(mf["names"])
    ignore = next((i for i, nm in enumerate(mf["names"]) if nm.lower() == "ignore"), None)
    if ignore is not None:
        ytr[ytr == ignore] = -1
    divisor = float(ds.divisor)
    mean = torch.tensor(ds.mean, device=dev).view(1, c, 1, 1)
    std = torch.tensor(ds.std, device=dev).clamp(min=1e-3).view(1, c, 1, 1)
    model = UNet(c, k, a.width).to(dev).to(memory_format=torch.channels_last)
    if world:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    decay = [p for nm, p in model.named_parameters() if p.dim() == 4]
    rest = [p for nm, p in model.named_parameters() if p.dim() != 4]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0}],
                          lr=a.lr, momentum=0.9, nesterov=True)
    pad = max(1, round(min(h, w) / 12))
    per_epoch = n // a.batch
    total = per_epoch * a.epochs
    aug_epochs = max(a.epochs - math.ceil(a.epochs / 10), 1)

    def norm(xb):
        return ((xb.float() / divisor) - mean) / std

    def augment(xb, yb):
        xp = F.pad(xb, (pad, pad, pad, pad))
        yp = F.pad(yb, (pad, pad, pad, pad), value=-1)
        dy = torch.randint(0, 2 * pad + 1, (xb.shape[0],), device=dev)
        dx = torch.randint(0, 2 * pad + 1, (xb.shape[0],), device=dev)
        iy = (dy.view(-1, 1) + torch.arange(h, device=dev).view(1, -1))
        ix = (dx.view(-1, 1) + torch.arange(w, device=dev).view(1, -1))
        flip = torch.rand(xb.shape[0], device=dev) < 0.5
        ix = torch.where(flip.view(-1, 1), ix.flip(1), ix)
        bi = torch.arange(xb.shape[0], device=dev).view(-1, 1, 1)
        xo = xp.permute(0, 2, 3, 1)[bi, iy.view(-1, h, 1), ix.view(-1, 1, w)].permute(0, 3, 1, 2)
        yo = yp[bi, iy.view(-1, h, 1), ix.view(-1, 1, w)]
        return xo, yo

    def step(xb, yb, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(xb)
        loss = seg_loss(out, yb, k)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def batch(idx, aug):
        xb, yb = norm(xtr[idx]), ytr[idx]
        if aug:
            xb, yb = augment(xb, yb)
        return xb.contiguous(memory_format=torch.channels_last), yb

    model.train()
    if a.speed_only:
        for i in range(a.warmup + a.steps):
            if i == a.warmup:
                torch.cuda.synchronize()
                if world:
                    dist.barrier()
                t0 = time.perf_counter()
            idx = torch.randint(0, n, (a.batch,), device=dev)
            loss = step(*batch(idx, True), a.lr)
        torch.cuda.synchronize()
        if world:
            dist.barrier()
        dt = time.perf_counter() - t0
        if rank:
            return
        print(json.dumps({"framework": "pytorch " + torch.__version__ + " eager"
                          + (f" DDP x{world}" if world else ""), "shape": f"{c}x{h}x{w}",
                          "batch": a.batch, "width": a.width, "world": max(world, 1),
                          "samples_per_sec": round(max(world, 1) * a.batch * a.steps / dt, 1),
                          "peak_gpu_mem_bytes": torch.cuda.max_memory_allocated(),
                          "loss": float(loss)}), flush=True)
        return
    _, xte, yte, _ = load(a.data, "test", dev)
    if ignore is not None:
        yte[yte == ignore] = -1
    step_i, timed_s, timed_n = 0, 0.0, 0
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(n, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in range(per_epoch):
            idx = perm[b * a.batch:(b + 1) * a.batch]
            loss = step(*batch(idx, epoch < aug_epochs), one_cycle(step_i, total, a.lr))
            step_i += 1
        torch.cuda.synchronize()
        if epoch > 0:
            timed_s += time.perf_counter() - t0
            timed_n += per_epoch * a.batch
        dice, counts = evaluate(model, xte, yte, k, norm, a.batch)
        print(json.dumps({"epoch": epoch + 1, "train_loss": float(loss), "test_mean_dice": dice}), flush=True)
    print(json.dumps({"framework": "pytorch " + torch.__version__ + " eager", "shape": f"{c}x{h}x{w}",
                      "batch": a.batch, "width": a.width, "epochs": a.epochs,
                      "samples_per_sec": round(timed_n / max(timed_s, 1e-9), 1),
                      "test_mean_dice": dice, "per_class_dice": counts,
                      "peak_gpu_mem_bytes": torch.cuda.max_memory_allocated(), "summary": True}), flush=True)


@torch.no_grad()
def evaluate(model, x, y, k, norm, batch):
    """Mean foreground Dice over the split from per-class counts, as prep scores it."""
    model.eval()
    tp = torch.zeros(k, dtype=torch.float64, device=x.device)
    fp, fn = tp.clone(), tp.clone()
    for i in range(0, x.shape[0], batch):
        xb = norm(x[i:i + batch]).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(xb).argmax(1)
        t = y[i:i + batch]
        v = t >= 0
        for cl in range(k):
            p, g = (pred == cl) & v, (t == cl) & v
            tp[cl] += (p & g).sum()
            fp[cl] += (p & ~g).sum()
            fn[cl] += (~p & g).sum()
    dice = [(2 * tp[c] / (2 * tp[c] + fp[c] + fn[c])).item() if (tp[c] + fp[c] + fn[c]) > 0 else None
            for c in range(k)]
    fg = [d for d in dice[1:] if d is not None]
    return (sum(fg) / len(fg) if fg else float("nan")), dice


if __name__ == "__main__":
    main()
