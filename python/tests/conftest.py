"""Shared fixtures: the `prep` binary of this checkout and small datasets made with it."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def prep_bin() -> str:
    """The `prep` executable: $PREP_BIN, else target/release/prep of this checkout."""
    p = os.environ.get("PREP_BIN") or str(REPO / "target" / "release" / "prep")
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.fail(f"{p} not found: run `cargo build --release` at {REPO} (or set PREP_BIN)")
    return p


def run_prep(*args: str) -> str:
    r = subprocess.run([prep_bin(), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"prep {' '.join(map(str, args))} failed:\n{r.stderr}"
    return r.stdout


def synth(out: Path, train: int, test: int = 100, shape: str = "3x8x8", block: int = 64,
          shard_blocks: int = 5, seed: int = 0) -> Path:
    run_prep("synth", "--train", train, "--test", test, "--shape", shape, "--out", out,
             "--block-samples", block, "--shard-blocks", shard_blocks, "--seed", seed, "--quiet")
    return out


@pytest.fixture(scope="session")
def small_ds(tmp_path_factory) -> Path:
    """3,000 train samples of 3x8x8 in 47 blocks of 64 (the last one 56) over 10 shards."""
    return synth(tmp_path_factory.mktemp("synth") / "ds", 3000)


@pytest.fixture
def damaged_copy(small_ds, tmp_path) -> Path:
    d = tmp_path / "damaged"
    shutil.copytree(small_ds, d)
    return d


def rows(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each sample as one row of bytes (pixels then label), sorted: a multiset to compare."""
    n = len(labels)
    flat = np.ascontiguousarray(images).reshape(n, -1).view(np.uint8)
    r = np.concatenate([flat, labels.astype("<i8").reshape(n, 1).view(np.uint8)], axis=1)
    r = np.ascontiguousarray(r)
    return np.sort(r.view(f"V{r.shape[1]}").ravel())
