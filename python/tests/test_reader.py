"""The package on small generated datasets: metadata, random access, prep train's order, shares
by worker x rank, resume, damage, bad paths, float datasets."""

import json
import os
import struct

import numpy as np
import pytest

import prep
from prep import _prep, worker_plan
from conftest import rows, run_prep, synth


def all_samples(split):
    """Every sample in file order, read block by block in one call."""
    return split.take(np.arange(len(split)))


def collect(it):
    got = list(it)
    if not got:
        return None, None
    return np.concatenate([b[0] for b in got]), np.concatenate([b[1] for b in got])


# -- metadata and random access ---------------------------------------------------------------


def test_metadata(small_ds):
    ds = prep.open(small_ds)
    m = json.loads((small_ds / "manifest.json").read_text())
    assert ds.shape == (3, 8, 8) and ds.dtype == np.uint8
    assert ds.classes == m["classes"] and ds.num_classes == 10
    assert ds.splits == ["test", "train"] and "train" in ds and "valid" not in ds
    assert ds.counts == {"train": 3000, "test": 100}
    assert sum(ds.class_counts["train"]) == 3000
    assert ds.mean == m["mean"] and ds.std == m["std"] and len(ds.mean) == 3
    assert ds.provenance["tool"].startswith("prep ") and "synth" in ds.provenance["command"]
    assert ds.divisor == 255.0 and ds.codec == "zstd" and ds.block_samples == 64
    # The manifest's own path names the dataset too.
    assert prep.open(small_ds / "manifest.json").counts == ds.counts
    s = ds["train"]
    assert ds["train"] is s  # opened once
    assert len(s) == 3000 and s.num_blocks == 47 and s.block_sizes[-1] == 3000 - 46 * 64
    assert "3000 samples" in repr(s) and "3x8x8" in repr(ds)


def test_random_access_reads_one_block_and_caches(small_ds):
    ds = prep.open(small_ds, cache_bytes=1)  # one block kept
    s = ds["train"]
    images, labels = all_samples(s)
    assert images.shape == (3000, 3, 8, 8) and labels.dtype == np.int64
    for i in [0, 1, 63, 64, 65, 2999, 1500]:
        x, y = s[i]
        assert x.shape == (3, 8, 8) and x.dtype == np.uint8 and x.flags.writeable
        assert np.array_equal(x, images[i]) and y == labels[i] and isinstance(y, int)
    x, y = s[-1]
    assert np.array_equal(x, images[-1])
    s2 = prep.open(small_ds)["train"]
    for i in range(128):  # two blocks, in order: two reads
        s2[i]
    assert s2.cache_info() == {"hits": 126, "misses": 2}
    with pytest.raises(IndexError, match="3000 samples"):
        s[3000]
    with pytest.raises(IndexError):
        s[-3001]
    with pytest.raises(TypeError):
        s[1:3]
    # Iterating a split walks the file order.
    for i, (x, y) in enumerate(s):
        if i == 70:
            assert np.array_equal(x, images[70]) and y == labels[70]
            break
    # take: any order, repeats allowed.
    pick = np.array([5, 2999, 5, 100, 64, 0])
    x, y = s.take(pick, threads=2)
    assert np.array_equal(x, images[pick]) and np.array_equal(y, labels[pick])
    with pytest.raises(IndexError):
        s.take([0, 3000])
    x, y = s.take([])
    assert x.shape == (0, 3, 8, 8) and y.shape == (0,)


# -- order ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,epoch,batch", [(0, 0, 128), (42, 3, 100), (7, 1, 512)])
def test_batches_are_prep_trains_order(small_ds, seed, epoch, batch):
    """Rank 0 of 1 with drop_last: the batches `prep train` streams (its loader, run by Rust)."""
    s = prep.open(small_ds)["train"]
    theirs = _prep._prep_train_epoch(s._native, batch, seed, epoch, 2)
    ours = list(s.batches(batch, seed=seed, epoch=epoch, drop_last=True))
    assert len(ours) == len(theirs) == 3000 // batch
    for (px, lb), (x, y) in zip(theirs, ours):
        assert np.array_equal(np.asarray(px), x) and np.array_equal(np.asarray(lb), y)
    # The same order whatever the number of threads, and as `order()` says.
    images, labels = all_samples(s)
    x, y = collect(s.batches(batch, seed=seed, epoch=epoch, threads=1))
    order = s.order(seed=seed, epoch=epoch)
    assert np.array_equal(x, images[order]) and np.array_equal(y, labels[order])
    assert len(x) == 3000  # drop_last=False keeps the partial batch
    # Another epoch or seed is another order.
    assert not np.array_equal(order, s.order(seed=seed, epoch=epoch + 1))
    assert not np.array_equal(order, s.order(seed=seed + 1, epoch=epoch))


def test_file_order_without_shuffle(small_ds):
    s = prep.open(small_ds)["train"]
    images, labels = all_samples(s)
    x, y = collect(s.batches(97, shuffle=False))
    assert np.array_equal(x, images) and np.array_equal(y, labels)
    it = s.batches(97, shuffle=False, drop_last=True)
    assert len(it) == 3000 // 97
    x, y = collect(it)
    assert np.array_equal(x, images[: 3000 // 97 * 97])


# -- shares: ranks, workers -------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_are_disjoint_and_complete(small_ds, world, shuffle):
    s = prep.open(small_ds)["train"]
    images, labels = all_samples(s)
    xs, ys, orders = [], [], []
    for rank in range(world):
        it = s.batches(100, shuffle=shuffle, seed=3, epoch=2, rank=rank, world_size=world)
        n_batches = len(it)
        x, y = collect(it)
        assert it.position == n_batches == s.num_batches(100, shuffle, 3, 2, rank, world)
        order = s.order(seed=3, epoch=2, shuffle=shuffle, rank=rank, world_size=world)
        assert np.array_equal(x, images[order]) and np.array_equal(y, labels[order])
        xs.append(x), ys.append(y), orders.append(order)
    allo = np.concatenate(orders)
    assert np.array_equal(np.sort(allo), np.arange(3000)), "a sample missing or read twice"
    assert np.array_equal(rows(np.concatenate(xs), np.concatenate(ys)), rows(images, labels))
    with pytest.raises(ValueError):
        s.batches(100, rank=world, world_size=world)


def dataloader(split, plan, batch, **kw):
    """What torch's DataLoader does with an IterableDataset and len(plan) workers: it asks the
    workers for a batch in turn, passing over those that have ended."""
    its = []
    for share, count, start, stop in plan["workers"]:
        it = split.batches(batch, rank=share, world_size=count, start=start, **kw)
        its.append(iter([next(it) for _ in range(stop - start)]))
    live = list(range(len(its)))
    out = []
    while live:
        for w in list(live):
            try:
                out.append(next(its[w]))
            except StopIteration:
                live.remove(w)
    return out


@pytest.mark.parametrize("world,workers", [(1, 1), (1, 2), (2, 2), (2, 3), (3, 4)])
def test_worker_x_rank_shares(small_ds, world, workers):
    """Every worker of every rank reads its own blocks; together, every sample once."""
    s = prep.open(small_ds)["train"]
    images, labels = all_samples(s)
    kw = dict(shuffle=True, seed=11, epoch=4, drop_last=False)
    xs, ys = [], []
    for rank in range(world):
        plan = worker_plan(s, 64, rank=rank, world_size=world, num_workers=workers, **kw)
        got = dataloader(s, plan, 64, **kw)
        assert len(got) == plan["total"]
        xs += [b[0] for b in got]
        ys += [b[1] for b in got]
    assert np.array_equal(rows(np.concatenate(xs), np.concatenate(ys)), rows(images, labels))


def test_equal_batches_per_rank(small_ds):
    s = prep.open(small_ds)["train"]
    kw = dict(shuffle=True, seed=1, epoch=0, drop_last=True, equal_batches=True)
    totals = []
    for rank in range(3):
        plan = worker_plan(s, 50, rank=rank, world_size=3, num_workers=2, **kw)
        got = dataloader(s, plan, 50, shuffle=True, seed=1, epoch=0, drop_last=True)
        assert len(got) == plan["total"] and all(len(b[1]) == 50 for b in got)
        totals.append(plan["total"])
    assert len(set(totals)) == 1 and totals[0] > 0


# -- resume -----------------------------------------------------------------------------------


def test_resume_from_state(small_ds):
    s = prep.open(small_ds)["train"]
    full = list(s.batches(128, seed=9, epoch=5, rank=1, world_size=2))
    for cut in [0, 1, 3, 7, len(full) - 1, len(full)]:
        it = s.batches(128, seed=9, epoch=5, rank=1, world_size=2)
        head = [next(it) for _ in range(cut)]
        state = it.state_dict()
        it.close()
        assert state["position"] == cut and state["epoch"] == 5
        state = json.loads(json.dumps(state))  # a state survives a checkpoint file
        rest = list(s.resume(state))
        got = head + rest
        assert len(got) == len(full), cut
        for (a, b), (c, d) in zip(got, full):
            assert np.array_equal(a, c) and np.array_equal(b, d)
    # start= skips whole windows without decoding them and still lands on the batch.
    it = s.batches(128, seed=9, epoch=5, rank=1, world_size=2, start=9)
    x, y = next(it)
    assert it.position == 10 and np.array_equal(x, full[9][0])
    assert list(s.batches(128, seed=9, epoch=5, rank=1, world_size=2, start=10**6)) == []


@pytest.mark.parametrize("workers,world,rank", [(2, 1, 0), (3, 2, 1), (4, 1, 0)])
def test_resume_across_workers_is_exact(small_ds, workers, world, rank):
    """Resuming a multi-worker epoch after any number of batches gives the rest of the
    uninterrupted stream, in its order."""
    s = prep.open(small_ds)["train"]
    kw = dict(shuffle=True, seed=2, epoch=1, drop_last=False)
    plan0 = worker_plan(s, 40, rank=rank, world_size=world, num_workers=workers, **kw)
    full = dataloader(s, plan0, 40, **kw)
    for cut in sorted({0, 1, workers - 1, workers, workers + 1, len(full) // 2, len(full) - 1,
                       len(full)}):
        plan = worker_plan(s, 40, rank=rank, world_size=world, num_workers=workers,
                           position=cut, **kw)
        rest = dataloader(s, plan, 40, **kw)
        got = full[:cut] + rest
        assert len(got) == len(full), cut
        for (a, b), (c, d) in zip(got, full):
            assert np.array_equal(a, c) and np.array_equal(b, d), cut


# -- damage -----------------------------------------------------------------------------------


def flip_block_byte(ds_dir, shard="train/train-00001.shard", block=0):
    """Flip one byte in the payload of `block` of a shard (offsets from its footer)."""
    p = ds_dir / shard
    data = bytearray(p.read_bytes())
    # Trailer (last 32 bytes): footer offset (u64) then footer length (u64); see formats/shard.md.
    footer_offset = struct.unpack_from("<Q", data, len(data) - 32)[0]
    offset, stored = struct.unpack_from("<QQ", data, footer_offset + 40 * block)
    data[offset + stored // 2] ^= 0x20
    p.write_bytes(bytes(data))
    return str(p)


def test_trailer_layout_as_the_test_assumes(small_ds):
    data = (small_ds / "train/train-00000.shard").read_bytes()
    footer_offset = struct.unpack_from("<Q", data, len(data) - 32)[0]
    assert struct.unpack_from("<Q", data, footer_offset)[0] == 64  # block 0 right after the header


def test_damaged_block_raises_naming_shard_and_block(damaged_copy):
    path = flip_block_byte(damaged_copy, block=2)
    ds = prep.open(damaged_copy)
    s = ds["train"]  # the index is intact: opening works
    bad = 5 * 64 + 2 * 64  # shard 1 holds blocks 5..9 of the split
    x, y = s[0]
    with pytest.raises(prep.DamagedBlockError) as e:
        s[bad + 3]
    assert e.value.file == path and e.value.block == 2
    assert "train-00001.shard" in str(e.value) and "block 2" in str(e.value)
    assert isinstance(e.value, prep.DatasetError) and isinstance(e.value, ValueError)
    # It pickles (a DataLoader worker sends it to the main process that way).
    import pickle
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is prep.DamagedBlockError and again.block == 2 and again.file == path
    with pytest.raises(prep.DamagedBlockError, match="block 2"):
        s.take([0, bad])
    with pytest.raises(prep.DamagedBlockError, match="train-00001.shard"):
        for _ in s.batches(100, seed=1):
            pass
    # skip_damaged: the other blocks, and a count.
    it = s.batches(100, seed=1, skip_damaged=True)
    x, y = collect(it)
    assert len(y) == 3000 - 64 and it.skipped == 1
    assert "block 2" in it.damaged[0] and "train-00001.shard" in it.damaged[0]
    clean = prep.open(damaged_copy)["train"]
    keep = np.r_[0:bad, bad + 64:3000]
    images, labels = clean.take(keep)
    assert np.array_equal(rows(x, y), rows(images, labels))


def test_damaged_shard_header_and_missing_shard(damaged_copy):
    p = damaged_copy / "train/train-00003.shard"
    data = bytearray(p.read_bytes())
    data[20] ^= 1
    p.write_bytes(bytes(data))
    ds = prep.open(damaged_copy)
    with pytest.raises(prep.DatasetError, match="train-00003.shard: header"):
        ds["train"]
    assert ds["test"][0][0].shape == (3, 8, 8)
    (damaged_copy / "train/train-00003.shard").unlink()
    with pytest.raises(FileNotFoundError) as e:
        prep.open(damaged_copy)["train"]
    assert e.value.filename.endswith("train-00003.shard")


# -- bad paths --------------------------------------------------------------------------------


def test_bad_paths(tmp_path, small_ds):
    with pytest.raises(FileNotFoundError) as e:
        prep.open(tmp_path / "nowhere")
    assert e.value.filename == str(tmp_path / "nowhere")
    with pytest.raises(prep.DatasetError, match="not a prep dataset"):
        prep.open(tmp_path)
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    with pytest.raises(prep.DatasetError, match="not a directory"):
        prep.open(f)
    bad = tmp_path / "badjson"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(prep.DatasetError, match="manifest.json"):
        prep.open(bad)
    with pytest.raises(KeyError, match="no split 'valid'"):
        prep.open(small_ds)["valid"]
    # A manifest with one changed byte fails its checksum.
    changed = tmp_path / "changed"
    changed.mkdir()
    text = (small_ds / "manifest.json").read_text().replace('"test"', '"tesT"', 1)
    (changed / "manifest.json").write_text(text)
    with pytest.raises(prep.DatasetError, match="manifest.json"):
        prep.open(changed)
    # A colmajor dataset is named as such.
    run_prep("synth", "--train", 50, "--test", 10, "--shape", "1x4x4", "--out", tmp_path / "cm2",
             "--format", "colmajor", "--quiet")
    with pytest.raises(prep.DatasetError, match="colmajor"):
        prep.open(tmp_path / "cm2")


@pytest.mark.parametrize("kind", ["dev-zero", "dev-urandom", "fifo", "socket", "directory"])
@pytest.mark.parametrize("where", ["manifest.json", "train/train-00003.shard"])
def test_special_files_are_refused_at_once(damaged_copy, kind, where):
    """A manifest or shard that is a device, FIFO, socket or folder: an OSError naming it within
    seconds, never a read that does not end (issue 24)."""
    import socket
    import subprocess
    import sys
    import time

    p = damaged_copy / where
    p.unlink()
    if kind.startswith("dev-"):
        p.symlink_to("/dev/" + kind[4:])
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    else:
        p.mkdir()

    # In a child process: a read that never ends runs in Rust without the GIL, where no
    # Python alarm could stop it.
    code = ("import prep, sys\n"
            "try:\n"
            f"    prep.open({str(damaged_copy)!r})['train']\n"
            "except OSError as e:\n"
            "    print(type(e).__name__, e); sys.exit(0)\n"
            "sys.exit('no error')\n")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "not a regular file" in r.stdout and str(p) in r.stdout, r.stdout
    assert time.monotonic() - t < 20


def test_bad_arguments(small_ds):
    s = prep.open(small_ds)["train"]
    for kw in [dict(batch_size=0), dict(batch_size=10, rank=2, world_size=2),
               dict(batch_size=10, world_size=0), dict(batch_size=10, threads=0),
               dict(batch_size=10, seed=-1), dict(batch_size=10, start=-1)]:
        with pytest.raises(ValueError):
            s.batches(**kw)


# -- dtypes -----------------------------------------------------------------------------------


def write_npy(d, images, labels):
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "x_train.npy", images)
    np.save(d / "y_train.npy", labels.astype(np.int64))


@pytest.mark.parametrize("dtype,np_dtype", [("f32", np.float32), ("f16", np.float16),
                                            ("u16", np.uint16)])
def test_float_and_u16_datasets_read_as_such(tmp_path, dtype, np_dtype):
    rng = np.random.default_rng(1)
    n, h, w = 300, 6, 5
    if dtype == "u16":
        vals = rng.integers(0, 65536, (n, h, w)).astype(np.uint16)
    else:
        vals = (rng.standard_normal((n, h, w)) * 1000).astype(np.float32)
        vals[0, 0, :4] = [-0.0, 1e-40, -3.5, 65504.0]  # signed zero, a subnormal
    labels = np.arange(n) % 4
    write_npy(tmp_path / "src", vals, labels)
    out = tmp_path / "ds"
    run_prep("convert", tmp_path / "src", "--out", out, "--dtype", dtype, "--block-samples", 32,
             "--quiet")
    ds = prep.open(out)
    assert ds.dtype == np_dtype and ds.shape == (1, h, w) and ds.counts == {"train": n}
    assert ds.format_version == (2 if dtype != "u16" else 1)
    s = ds["train"]
    want = vals.astype(np_dtype).reshape(n, 1, h, w)
    for i in [0, 1, 31, 32, n - 1]:
        x, y = s[i]
        assert x.dtype == np_dtype and y == labels[i]
        assert x.tobytes() == want[i].tobytes(), i  # bit for bit
    x, y = collect(s.batches(64, shuffle=False))
    assert x.dtype == np_dtype and x.shape == (n, 1, h, w)
    assert x.tobytes() == want.tobytes() and np.array_equal(y, labels)
    x, y = collect(s.batches(64, seed=3))
    order = s.order(seed=3)
    assert x.tobytes() == want[order].tobytes()
