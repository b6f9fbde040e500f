"""prep.torch with PyTorch's DataLoader (skipped where torch is not installed; runs on the GPU
machine): worker x rank shares read every sample once, state_dict resumes exactly, pin_memory
returns pinned tensors."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import prep  # noqa: E402
import prep.torch as pt  # noqa: E402
from conftest import rows  # noqa: E402


def as_np(batches):
    return (np.concatenate([x.numpy() for x, _ in batches]),
            np.concatenate([y.numpy() for _, y in batches]))


@pytest.mark.parametrize("world", [1, 2])
def test_two_workers_and_ranks_read_every_sample_once(small_ds, world):
    s = prep.open(small_ds)["train"]
    images, labels = s.take(np.arange(len(s)))
    got = []
    for rank in range(world):
        data = pt.ShardDataset(small_ds, "train", batch_size=100, seed=4, rank=rank,
                               world_size=world)
        data.set_epoch(2)
        loader = pt.DataLoader(data, num_workers=2)
        batches = list(loader)
        assert len(batches) == len(loader) == len(data) or world > 1
        assert all(x.dtype == torch.uint8 and x.shape[1:] == (3, 8, 8) for x, _ in batches)
        assert all(y.dtype == torch.int64 for _, y in batches)
        got += batches
    x, y = as_np(got)
    assert np.array_equal(rows(x, y), rows(images, labels))


def test_plain_dataloader_matches_the_plan(small_ds):
    """A plain torch DataLoader (batch_size=None) interleaves the workers as worker_plan says."""
    s = prep.open(small_ds)["train"]
    data = pt.ShardDataset(small_ds, batch_size=64, seed=1)
    got = list(torch.utils.data.DataLoader(data, batch_size=None, num_workers=3))
    plan = prep.worker_plan(s, 64, shuffle=True, seed=1, epoch=0, drop_last=False, rank=0,
                            world_size=1, num_workers=3)
    assert len(got) == plan["total"]
    want = []
    its = [s.batches(64, seed=1, rank=sh, world_size=c, start=a) for sh, c, a, _ in plan["workers"]]
    live = list(range(3))
    while live:
        for w in list(live):
            try:
                want.append(next(its[w]))
            except StopIteration:
                live.remove(w)
    for (x, y), (a, b) in zip(got, want):
        assert np.array_equal(x.numpy(), a) and np.array_equal(y.numpy(), b)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_resumes_exactly(small_ds, workers):
    def make():
        d = pt.ShardDataset(small_ds, batch_size=50, seed=7, rank=1, world_size=2)
        d.set_epoch(3)
        return d, pt.DataLoader(d, num_workers=workers)

    _, loader = make()
    full = list(loader)
    for cut in [1, 3, len(full) - 2]:
        data, loader = make()
        head = []
        for b in loader:
            head.append(b)
            if len(head) == cut:
                break
        state = loader.state_dict()
        assert state["position"] == cut and state["epoch"] == 3
        data2, loader2 = make()
        data2.load_state_dict(state)
        data2.set_epoch(3)  # the loaded epoch: keeps its position
        rest = list(loader2)
        got = head + rest
        assert len(got) == len(full)
        for (x, y), (a, b) in zip(got, full):
            assert torch.equal(x, a) and torch.equal(y, b)
    # A finished epoch starts again from its first batch; another epoch from its own.
    assert len(list(loader2)) == len(full)
    data2.set_epoch(4)
    assert data2.position == 0


def test_state_refuses_other_settings(small_ds):
    d = pt.ShardDataset(small_ds, batch_size=50, seed=7)
    state = d.state_dict()
    with pytest.raises(ValueError, match="seed"):
        pt.ShardDataset(small_ds, batch_size=50, seed=8).load_state_dict(state)
    with pytest.raises(ValueError):
        pt.DataLoader(d, num_workers=2, persistent_workers=True)


def test_rank_from_torch_distributed(small_ds, tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        d = pt.ShardDataset(small_ds, batch_size=50)
        assert d.rank_world() == (0, 1)
        assert pt.ShardDataset(small_ds, batch_size=50, rank=1, world_size=3).rank_world() == (1, 3)
    finally:
        dist.destroy_process_group()


def test_damaged_block_in_a_worker(damaged_copy):
    from test_reader import flip_block_byte

    flip_block_byte(damaged_copy, block=1)
    data = pt.ShardDataset(damaged_copy, batch_size=100, seed=0)
    with pytest.raises(Exception, match="train-00001.shard"):
        list(pt.DataLoader(data, num_workers=2))
    data = pt.ShardDataset(damaged_copy, batch_size=100, seed=0, skip_damaged=True)
    x, _ = as_np(list(pt.DataLoader(data, num_workers=2)))
    assert len(x) == 3000 - 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory(small_ds, workers):
    data = pt.ShardDataset(small_ds, batch_size=100, pin_memory=True)
    for x, y in pt.DataLoader(data, num_workers=workers):
        assert x.is_pinned() and y.is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device= needs CUDA")
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_device_batches_equal_cpu_batches(small_ds, workers):
    """device="cuda": the same batches in the same order as CPU batches, on the GPU (with
    workers through the shared-memory ring, whose slots are reused many times over here: a
    slot refilled before its copy had completed would show here)."""
    def loader(device):
        data = pt.ShardDataset(small_ds, batch_size=64, seed=3)
        data.set_epoch(1)
        extra = {"prefetch_factor": 2} if workers else {}
        return data, pt.DataLoader(data, num_workers=workers, device=device, **extra)

    _, cpu = loader(None)
    want = list(cpu)
    data, gpu = loader("cuda")
    got = []
    for x, y in gpu:
        assert x.is_cuda and y.is_cuda and x.dtype == torch.uint8 and y.dtype == torch.int64
        got.append((x, y))
    assert len(got) == len(want) == len(gpu)
    for (x, y), (a, b) in zip(got, want):
        assert torch.equal(x.cpu(), a) and torch.equal(y.cpu(), b)
    assert data.state_dict()["position"] == len(want)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("prep-ring-")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device= needs CUDA")
def test_device_loader_stopped_early_resumes(small_ds):
    data = pt.ShardDataset(small_ds, batch_size=64, seed=3)
    loader = pt.DataLoader(data, num_workers=2, device="cuda")
    first = []
    for i, (x, y) in enumerate(loader):
        first.append(y.cpu())
        if i == 4:
            break
    del loader
    state = data.state_dict()
    assert state["position"] == 5
    again = pt.ShardDataset(small_ds, batch_size=64, seed=3)
    again.load_state_dict(state)
    rest = [y.cpu() for _, y in pt.DataLoader(again, num_workers=2, device="cuda")]
    whole = [y for _, y in pt.DataLoader(pt.ShardDataset(small_ds, batch_size=64, seed=3),
                                         num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(first + rest, whole))
    assert len(first + rest) == len(whole)


def test_device_must_be_cuda(small_ds):
    with pytest.raises(ValueError, match="CUDA device"):
        pt.DataLoader(pt.ShardDataset(small_ds, batch_size=64), device="cpu")


def test_worker_cpus_leave_the_launching_core(monkeypatch):
    assert pt._cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    now = pt._current_cpu()
    allowed = os.sched_getaffinity(0)
    assert now in allowed or now in range(os.cpu_count() or 1)
    if len(allowed) < 4:
        assert pt._worker_cpus(2) is None
        return
    # This thread's core (and its SMT siblings) is left out, the rest given.
    cpu = max(allowed)
    monkeypatch.setattr(pt, "_current_cpu", lambda: cpu)
    cpus = pt._worker_cpus(2)
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    core = pt._cpu_list(open(path).read()) if os.path.exists(path) else {cpu}
    assert cpu in core
    assert set(cpus) == set(allowed) - core
    assert pt._worker_cpus(len(allowed)) is None  # fewer CPUs left than workers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device= needs CUDA")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="needs 4 CPUs")
@pytest.mark.parametrize("reserve", [True, False])
def test_device_workers_run_on_the_cpus_given(small_ds, monkeypatch, reserve):
    """The workers (and the reader threads they start) run where _worker_cpus says; with
    reserve_core=False, wherever this process may."""
    monkeypatch.setattr(pt, "_worker_cpus", lambda workers: [1, 2, 3])
    loader = pt.DataLoader(pt.ShardDataset(small_ds, batch_size=64, seed=3), num_workers=2,
                           device="cuda", reserve_core=reserve)
    seen = []
    for i, _ in enumerate(loader):
        if i == 2:
            for task in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{task}/children") as f:
                    for pid in f.read().split():
                        for t in os.listdir(f"/proc/{pid}/task"):  # the worker's threads too
                            seen.append(os.sched_getaffinity(int(t)))
    assert seen
    want = {1, 2, 3} if reserve else os.sched_getaffinity(0)
    assert all(s == want for s in seen), seen


@pytest.mark.parametrize("task", ["mask", "labels", "values"])
@pytest.mark.parametrize("workers", [0, 2])
def test_fields_come_as_dicts_of_tensors(tmp_path, task, workers):
    """A dataset whose samples carry fields: dicts of CPU tensors, rows beside their images,
    every sample once, dtypes as stored (a u16 mask as int32 where torch lacks uint16)."""
    from conftest import run_prep
    out = tmp_path / "ds"
    run_prep("synth", "--task", task, "--train", 300, "--test", 60, "--shape", "3x16x16",
             "--block-samples", 32, "--shard-blocks", 3, "--out", out, "--quiet")
    s = prep.open(out)["train"]
    every = s.take(np.arange(len(s)))
    name = prep.open(out).fields[0]["name"]
    data = pt.ShardDataset(out, "train", batch_size=40, seed=3)
    batches = list(pt.DataLoader(data, num_workers=workers))
    assert all(isinstance(b, dict) and list(b) == ["image", "class", name] for b in batches)
    assert all(b["class"].dtype == torch.int64 for b in batches)
    seen = {}
    for b in batches:
        for i in range(len(b["class"])):
            seen[b["image"][i].numpy().tobytes()] = b[name][i].numpy().tobytes()
    assert len(seen) == len(s)
    for i in range(len(s)):
        assert seen[every["image"][i].tobytes()] == every[name][i].tobytes()
    if torch.cuda.is_available():
        on = list(pt.DataLoader(pt.ShardDataset(out, "train", batch_size=40, seed=3),
                                num_workers=workers, device="cuda"))
        assert len(on) == len(batches)
        for a, b in zip(on, batches):
            assert list(a) == list(b)
            for k in b:
                assert a[k].device.type == "cuda"
                assert torch.equal(a[k].cpu(), b[k]), k


@pytest.mark.parametrize("workers", [0, 2])
def test_metadata_comes_as_lists_of_dicts(tmp_path, workers):
    """A `meta` field: a list of dicts a batch, beside the image tensors, on every path."""
    import json
    from conftest import run_prep
    n = 90
    x = (np.arange(n * 4 * 4) % 251).astype(np.uint8).reshape(n, 4, 4)
    np.save(tmp_path / "x_train.npy", x)
    np.save(tmp_path / "y_train.npy", (np.arange(n) % 3).astype(np.uint8))
    lines = [{"case": f"c{i // 9}", "slice": i % 9} for i in range(n)]
    (tmp_path / "meta_train.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = tmp_path / "ds"
    run_prep("convert", tmp_path, "--out", out, "--test-fraction", "0", "--block-samples", 16,
             "--quiet")
    by_image = {x[i].tobytes(): lines[i] for i in range(n)}
    paths = [dict()] + ([dict(device="cuda")] if torch.cuda.is_available() else [])
    for extra in paths:
        data = pt.ShardDataset(out, "train", batch_size=20, seed=2)
        batches = list(pt.DataLoader(data, num_workers=workers, **extra))
        seen = 0
        for b in batches:
            assert isinstance(b["meta"], list) and len(b["meta"]) == len(b["class"])
            for img, m in zip(b["image"].cpu().numpy(), b["meta"]):
                assert by_image[img[0].tobytes()] == m
                seen += 1
        assert seen == n
