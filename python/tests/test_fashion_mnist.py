"""Every Fashion-MNIST sample and label read through the package equals the IDX bytes (Debian's
dataset-fashion-mnist; skipped when absent unless PREP_REQUIRE_FASHION_MNIST=1)."""

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

import prep
from conftest import run_prep

DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    if not (DIR / "train-images-idx3-ubyte.gz").is_file():
        if os.environ.get("PREP_REQUIRE_FASHION_MNIST") == "1":
            pytest.fail(f"{DIR} is missing: apt-get install dataset-fashion-mnist")
        pytest.skip(f"{DIR} not installed (apt-get install dataset-fashion-mnist)")
    out = tmp_path_factory.mktemp("fm") / "fm"
    run_prep("convert", DIR, "--out", out, "--quiet")
    return prep.open(out)


def idx(prefix):
    px = gzip.open(DIR / f"{prefix}-images-idx3-ubyte.gz").read()
    lb = gzip.open(DIR / f"{prefix}-labels-idx1-ubyte.gz").read()
    assert px[:4] == b"\x00\x00\x08\x03" and lb[:4] == b"\x00\x00\x08\x01"
    n = int.from_bytes(px[4:8], "big")
    images = np.frombuffer(px[16:], np.uint8).reshape(n, 1, 28, 28)
    labels = np.frombuffer(lb[8:], np.uint8).astype(np.int64)
    return images, labels


@pytest.mark.parametrize("split,prefix,n", [("train", "train", 60000), ("test", "t10k", 10000)])
def test_every_sample_equals_the_idx_bytes(fashion, split, prefix, n):
    images, labels = idx(prefix)
    ds = fashion
    assert ds.shape == (1, 28, 28) and ds.dtype == np.uint8 and ds.num_classes == 10
    assert ds.counts[split] == n and ds.class_counts[split] == [n // 10] * 10
    s = ds[split]
    assert len(s) == n
    # Random access, one sample at a time, in file order.
    for i in range(n):
        x, y = s[i]
        assert x.shape == (1, 28, 28) and x.dtype == np.uint8
        if y != labels[i] or not np.array_equal(x, images[i]):
            pytest.fail(f"{split} sample {i} differs from the IDX file")
    # Batches in file order, and a shuffled epoch against its order.
    got = list(s.batches(1000, shuffle=False))
    assert np.array_equal(np.concatenate([b[0] for b in got]), images)
    assert np.array_equal(np.concatenate([b[1] for b in got]), labels)
    order = s.order(seed=5, epoch=1)
    got = list(s.batches(512, seed=5, epoch=1))
    assert np.array_equal(np.concatenate([b[0] for b in got]), images[order])
    assert np.array_equal(np.concatenate([b[1] for b in got]), labels[order])
    # Many samples at once.
    pick = np.random.default_rng(0).integers(0, n, 5000)
    x, y = s.take(pick)
    assert np.array_equal(x, images[pick]) and np.array_equal(y, labels[pick])
