"""Datasets whose samples carry fields (format version 3): every field through `split[i]` and
`take`, in the order of prep's own reader, checked against the summaries prep wrote."""

import json

import numpy as np
import pytest

import prep
from conftest import run_prep


@pytest.fixture(scope="module", params=["mask", "labels", "values"])
def task_ds(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"task-{request.param}") / "ds"
    run_prep("synth", "--task", request.param, "--train", 300, "--test", 60, "--shape", "3x16x16",
             "--block-samples", 32, "--shard-blocks", 3, "--out", out, "--quiet")
    return request.param, out


def test_every_field_by_index_and_by_take_in_file_order(task_ds):
    task, path = task_ds
    ds = prep.open(path)
    assert ds.format_version == 3
    (field,) = ds.fields
    assert field["kind"] == task
    name = field["name"]
    for split_name in ds.splits:
        s = ds[split_name]
        every = s.take(np.arange(len(s)), threads=2)
        assert set(every) == {"image", "class", name}
        assert every[name].shape == (len(s), *field["shape"])
        for i in range(0, len(s), 7):
            one = s[i]
            assert list(one) == ["image", "class", name]
            assert np.array_equal(one["image"], every["image"][i])
            assert one["class"] == every["class"][i]
            assert np.array_equal(one[name], every[name][i])
        # The summaries prep wrote as it generated the data, from what Python reads.
        summary = ds.manifest["splits"][split_name]["fields"][0]
        v = every[name]
        if task == "mask":
            assert v.dtype == np.uint8
            counts = np.bincount(v.ravel(), minlength=len(field["names"]))
            assert counts.tolist() == summary["counts"]
        elif task == "labels":
            assert set(np.unique(v)) <= {0, 1}
            assert v.sum(axis=0).tolist() == summary["counts"]
        else:
            assert v.dtype == np.float32
            assert np.all(np.isfinite(v))
            assert v.min(axis=0).tolist() == summary["min"]
            assert v.max(axis=0).tolist() == summary["max"]
            # Summed in f64 in sample order, as prep does.
            acc = np.zeros(v.shape[1])
            for row in v.astype(np.float64):
                acc += row
            assert acc.tolist() == summary["sum"]


def test_a_dataset_without_fields_keeps_its_tuples(small_ds):
    ds = prep.open(small_ds)
    assert ds.fields == []
    x, y = ds["train"][0]
    assert isinstance(y, int) and x.shape == ds.shape
    xs, ys = ds["train"].take([0, 1])
    assert xs.shape == (2, *ds.shape) and ys.shape == (2,)


@pytest.mark.parametrize("seed,epoch,shuffle", [(0, 0, True), (5, 2, True), (0, 0, False)])
def test_batches_yield_every_field_in_the_order_of_the_samples(task_ds, seed, epoch, shuffle):
    """`batches()` gives dicts whose rows are the samples `order()` names, field for field,
    across ranks and with resuming; `prep train`'s own loader gives the same images and classes."""
    _, path = task_ds
    ds = prep.open(path)
    s = ds["train"]
    names = ["image", "class"] + [f["name"] for f in ds.fields]
    every = s.take(np.arange(len(s)))
    got = list(s.batches(50, shuffle=shuffle, seed=seed, epoch=epoch, threads=2))
    assert all(list(b) == names for b in got)
    order = s.order(seed=seed, epoch=epoch, shuffle=shuffle)
    for k in names:
        joined = np.concatenate([b[k] for b in got])
        assert joined.dtype == every[k].dtype
        assert np.array_equal(joined, every[k][order]), k
    # Two ranks: disjoint, together every sample once, fields still beside their images.
    rows = {}
    for rank in range(2):
        for b in s.batches(40, shuffle=shuffle, seed=seed, epoch=epoch, rank=rank, world_size=2):
            for i in range(len(b["class"])):
                key = b["image"][i].tobytes()
                assert key not in rows
                rows[key] = b[names[2]][i].tobytes()
    assert len(rows) == len(s)
    for i in range(len(s)):
        assert rows[every["image"][i].tobytes()] == every[names[2]][i].tobytes()
    # Resuming at batch 2 gives the batches from the third on.
    it = s.batches(50, shuffle=shuffle, seed=seed, epoch=epoch)
    next(it), next(it)
    rest = list(s.resume(it.state_dict()))
    for a, b in zip(rest, got[2:]):
        assert all(np.array_equal(a[k], b[k]) for k in names)
    assert len(rest) == len(got) - 2
    # prep train's stream (drop_last, rank 0 of 1) is these batches' images and classes.
    if shuffle:
        from prep import _prep
        theirs = _prep._prep_train_epoch(s._native, 50, seed, epoch, 2)
        ours = list(s.batches(50, seed=seed, epoch=epoch, drop_last=True))
        for (px, lb), b in zip(theirs, ours):
            assert np.array_equal(np.asarray(px), b["image"])
            assert np.array_equal(np.asarray(lb), b["class"])


def test_metadata_comes_as_dicts(tmp_path):
    """A `meta` field (from `meta_train.jsonl` beside .npy arrays): `split[i]` gives the sample's
    dict, `take` and `batches()` lists of dicts in the order of the images."""
    n = 64
    x = (np.arange(n * 4 * 4) % 251).astype(np.uint8).reshape(n, 4, 4)
    np.save(tmp_path / "x_train.npy", x)
    np.save(tmp_path / "y_train.npy", (np.arange(n) % 2).astype(np.uint8))
    lines = [{"source": f"scan{i // 8}", "slice": i % 8, "t": i / 4} for i in range(n)]
    (tmp_path / "meta_train.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = tmp_path / "ds"
    run_prep("convert", tmp_path, "--out", out, "--test-fraction", "0", "--block-samples", 16,
             "--quiet")
    ds = prep.open(out)
    assert [f["kind"] for f in ds.fields] == ["meta"]
    s = ds["train"]
    for i in range(n):
        one = s[i]
        assert one["meta"] == lines[i]
        assert np.array_equal(one["image"][0], x[i])
    every = s.take(np.arange(n))
    assert every["meta"] == lines
    order = s.order(seed=1)
    got = [m for b in s.batches(10, seed=1) for m in b["meta"]]
    assert got == [lines[i] for i in order]
