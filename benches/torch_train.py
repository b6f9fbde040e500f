"""The PyTorch reference for `prep train` speed: the same model, the same recipe, data already on
the GPU. Prints one JSON line with samples/s (training steps only, after warm-up).

    python3 benches/torch_train.py --model resnet18 --shape 3x224x224 --batch 256
    python3 benches/torch_train.py --model small --shape 3x128x128 --batch 256 --compile

bf16 autocast, channels-last, cudnn.benchmark, SGD with Nesterov momentum 0.9 and weight decay
5e-4, cross-entropy with label smoothing 0.1. Each step normalises a uint8 batch gathered from a
dataset held in GPU memory (as `prep train --memory device` does), without crop or flip, which
only spares PyTorch work.

Under torchrun (WORLD_SIZE set) it is PyTorch DDP: one process per GPU (LOCAL_RANK), the model
wrapped in DistributedDataParallel (NCCL, bucketed all-reduce overlapped with the backward pass,
batch norm per rank), --batch per GPU, each rank with its own data on its GPU; rank 0 prints the
world's samples/s:

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 benches/torch_train.py \
        --model resnet18 --shape 3x224x224 --batch 256
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def small(c, classes):
    """`small` as prep defines it (src/nn/model.rs)."""
    layers, cin = [], c
    for i, w in enumerate([32, 64, 128]):
        layers += [nn.Conv2d(cin, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
        if i < 2:
            layers.append(nn.MaxPool2d(2))
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes)]
    return nn.Sequential(*layers)


def resnet18(c, h, w, classes):
    """torchvision's ResNet-18, with prep's stem rule: 7x7/2 and a 3x3/2 max-pool from 96 px up,
    a 3x3/1 stem without the pool below."""
    import torchvision

    m = torchvision.models.resnet18(num_classes=classes)
    if min(h, w) >= 96:
        m.conv1 = nn.Conv2d(c, 64, 7, stride=2, padding=3, bias=False)
    else:
        m.conv1 = nn.Conv2d(c, 64, 3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small", choices=["small", "resnet18"])
    ap.add_argument("--shape", default="3x32x32")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8192, help="dataset size held on the GPU")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print GPU time per kernel of 5 steps")
    a = ap.parse_args()
    c, h, w = (int(v) for v in a.shape.split("x"))
    torch.backends.cudnn.benchmark = True
    world, rank = int(os.environ.get("WORLD_SIZE", "0")), int(os.environ.get("RANK", "0"))
    if world:
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cuda")
    torch.manual_seed(rank)
    model = small(c, a.classes) if a.model == "small" else resnet18(c, h, w, a.classes)
    model = model.to(dev).to(memory_format=torch.channels_last)
    if world:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    data = torch.randint(0, 256, (a.samples, c, h, w), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, a.classes, (a.samples,), device=dev)
    mean = torch.full((1, c, 1, 1), 0.5, device=dev)
    std = torch.full((1, c, 1, 1), 0.25, device=dev)

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    if a.compile:
        step = torch.compile(step)

    def batch(i):
        idx = torch.randint(0, a.samples, (a.batch,), device=dev)
        x = data[idx].float().div_(255).sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
        return x, labels[idx]

    model.train()
    for i in range(a.warmup):
        step(*batch(i))
    torch.cuda.synchronize()
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(5):
                step(*batch(i))
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90))
        return
    if world:
        dist.barrier()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.steps):
        loss = step(*batch(i))
    torch.cuda.synchronize()
    if world:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({
            "framework": "pytorch " + torch.__version__ + (" compile" if a.compile else " eager")
            + (f" DDP x{world}" if world else ""),
            "model": a.model, "shape": a.shape, "batch": a.batch, "steps": a.steps,
            "world": max(world, 1),
            "samples_per_sec": round(max(world, 1) * a.batch * a.steps / dt, 1),
            "peak_gpu_mem_bytes": torch.cuda.max_memory_allocated(),
            "loss": float(loss.detach()),
        }), flush=True)
    if world:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
