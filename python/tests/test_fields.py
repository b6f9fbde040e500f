"""Datasets whose samples carry fields (format version 3): every field through `split[i]` and
`take`, in the order of prep's own reader, checked against the summaries prep wrote."""

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
