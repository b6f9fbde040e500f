"""prep against its peers on real photos: MosaicML Streaming (MDS), WebDataset and litdata.

    python3 scripts/make-photos.py /tmp/photos --sources .dev/photo-src --count 20000 --jobs 16
    python3 benches/peers.py --photos /tmp/photos --prep .dev/prep --work /tmp/peers \\
        --size 128 --workers 8 --batch 256 --out results.json
    scripts/bench-peers.sh            # the same on the GPU host, from the carried wheels

Every system stores the same samples: each photo decoded, resized so that its shorter side is
--size and centre-cropped to --size x --size RGB, labelled by its class folder. prep converts the
folder itself (`prep convert --size S --test-fraction 0`, all cores; codecs zstd, pred and, where
`prep convert --help` lists it, jpeg at quality 90). The peers' writers are fed by a
multiprocessing Pool of all cores that decodes, resizes (Pillow, bilinear with its antialiasing)
and crops; the writer itself is one process for MDS and WebDataset (their writers are
sequential; MDS's parallel recipe, sub-datasets and merge_index, is not used), and
litdata.optimize(num_workers=all cores) does both in its own workers. Variants:

  prep      zstd | pred | none | jpeg (q90)     pixels C x H x W, checksummed blocks
  mds       zstd            pixels C x H x W (ndarray:uint8), compression='zstd': the goal row
            zstd-xxh64      the same with hashes=['xxh64'] and validate_hash='xxh64' on read
            raw             the same without compression
            jpeg            a JPEG (q90) of the resized image in a 'bytes' column, decoded by
                            Pillow in __getitem__ (MDS's 'jpeg' encoding re-encodes any
                            in-memory image at Pillow's default quality 75, so q90 bytes go in
                            'bytes'; the read work is the same as the 'jpeg' encoding's)
  wds       jpg             .jpg (q90) + .cls + .id (the key) in tar shards, decode('rgb8')
            npy             .npy (C x H x W uint8) + .cls + .id
  litdata   pixels-zstd     numpy C x H x W uint8 (NumpySerializer), compression='zstd'
            jpeg            JPEG (q90) bytes, decoded by Pillow in the dataset's transform
                            (litdata's own JPEG deserializer needs torchvision)

Reading: one epoch of all samples, shuffled, batches of --batch, --workers DataLoader worker
processes, CPU uint8 tensors [B, C, H, W] (prep.torch.ShardDataset + prep.torch.DataLoader;
streaming.StreamingDataset in a torch DataLoader; wds.WebDataset(shardshuffle).shuffle(1000)
.batched() in a DataLoader(batch_size=None); litdata.StreamingDataset(shuffle=True) in a
litdata.StreamingDataLoader). --also-workers 0,16 reads every variant again with those worker
counts (0 for prep only: no worker processes, prep's reader threads on every core in the main
process, its documented setting for CPU batches). samples/s counts from the first batch to the last; the time to the
first batch is from creating the loader's iterator. --rounds epochs each (default 2): the table
gives the best round and the first round (MDS decompresses a compressed shard into the dataset
folder the first time it reads it, so its first epoch differs); the JSON has every round.

Bytes on disk: the files the writer left (a sum of file sizes, like du -sb); `bytes_after_read`
says what reading added (MDS's decompressed shards).

Flipped byte: the writer's files are copied twice (a clean copy and a damaged one); in the damaged
one the byte at 60% (+ 101 bytes, off any 512-byte alignment) of the largest file that is not
.json is XORed with 0xFF (for a tar file the JSON says which member's data or header it is). Both are read for
one epoch in file order, in the main process (no DataLoader: the same datasets and decoding as the
loaders, so the result does not depend on worker processes), each in a forked process with a time
limit; every sample's pixels are compared by a CRC per key (prep: by position; it stores no
keys). Result: `error: <exception>`, `silent: N of M samples differ[, K missing]` or
`silent: no visible change`. --flips K repeats it with K damaged copies (the byte at 60%, 40%,
80%, 50%, 70%), results joined by " / ": one byte can land where no sample is (tar padding).

--no-torch (for a machine without PyTorch): the timed epochs iterate each reader in the main
process instead of a DataLoader, and prep's reader is prep.Split.batches. MDS and litdata import
torch themselves, so they need at least a stand-in torch module to run then.

The "x prep-zstd" column is a row's samples/s over prep zstd's (the goal: mds zstd at most 0.5).
Each system runs in its own try/except: a failure is recorded and the others go on.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
import traceback
import types
import zlib

import numpy as np
from PIL import Image

SYSTEMS = ["prep", "mds", "wds", "litdata"]
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
SIZE = 128  # set by main before any pool starts (workers are forked)
FLIP_TIMEOUT = 300
LOADER_TIMEOUT = 180  # a DataLoader that gives no batch for this long raises
STAND_INS = []  # packages that import_streaming() stood in for


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# -- the photos ---------------------------------------------------------------------------------


def list_photos(root, count):
    """[(path, label, key)] of the first `count` photos (the first of each class in turn, so a
    short run keeps every class), and the class names."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    per = [sorted(f for f in os.listdir(os.path.join(root, c))
                  if f.lower().endswith((".jpg", ".jpeg"))) for c in classes]
    total = sum(len(p) for p in per)
    take = []
    if count is None or count >= total:
        for y, (c, files) in enumerate(zip(classes, per)):
            take += [(os.path.join(root, c, f), y) for f in files]
    else:
        i = 0
        while len(take) < count:
            for y, (c, files) in enumerate(zip(classes, per)):
                if i < len(files) and len(take) < count:
                    take.append((os.path.join(root, c, files[i]), y))
            i += 1
        take.sort()
    return [(p, y, k) for k, (p, y) in enumerate(take)], classes, total


def subset_folder(items, classes, work):
    """A folder of class folders with just these photos (hard links, else copies), for prep."""
    out = os.path.join(work, "photos-subset")
    shutil.rmtree(out, ignore_errors=True)
    for c in classes:
        os.makedirs(os.path.join(out, c))
    for p, y, _ in items:
        dst = os.path.join(out, classes[y], os.path.basename(p))
        try:
            os.link(p, dst)
        except OSError:
            shutil.copyfile(p, dst)
    return out


def square(path):
    """The photo resized so that its shorter side is SIZE (bilinear), centre-cropped, RGB."""
    im = Image.open(path)
    im = im.convert("RGB")
    w, h = im.size
    s = SIZE / min(w, h)
    nw, nh = max(SIZE, round(w * s)), max(SIZE, round(h * s))
    im = im.resize((nw, nh), Image.BILINEAR)
    x, y = (nw - SIZE) // 2, (nh - SIZE) // 2
    return im.crop((x, y, x + SIZE, y + SIZE))


def job_pixels(item):
    p, y, k = item
    return k, y, np.ascontiguousarray(np.asarray(square(p)).transpose(2, 0, 1))


def job_jpeg(item):
    p, y, k = item
    b = io.BytesIO()
    square(p).save(b, format="JPEG", quality=90)
    return k, y, b.getvalue()


def pooled(fn, items):
    """fn over items on all cores, in order."""
    with mp.get_context("fork").Pool(CPUS) as pool:
        yield from pool.imap(fn, items, chunksize=16)


def jpeg_chw(data):
    """JPEG bytes to a C x H x W uint8 array (a view; stacking makes it contiguous)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def sample_bytes(kind):
    """About what a sample takes, to size shards and chunks for about 32 of them (a JPEG at q90
    of these photos: about 4 KB at 128 x 128)."""
    return 3 * SIZE * SIZE if kind == "pixels" else 3 * SIZE * SIZE // 12


# -- batches ------------------------------------------------------------------------------------


def collate(samples):
    """(C x H x W arrays, labels, keys) samples to a batch of torch tensors."""
    import torch

    return (torch.from_numpy(np.stack([s[0] for s in samples])),
            torch.tensor([int(s[1]) for s in samples]), torch.tensor([int(s[2]) for s in samples]))


def np_batches(samples, batch):
    """Per-sample tuples grouped into numpy batches, in the main process."""
    buf = []
    for s in samples:
        buf.append(s)
        if len(buf) == batch:
            yield np.stack([b[0] for b in buf]), np.array([int(b[1]) for b in buf]), np.array([int(b[2]) for b in buf])
            buf = []
    if buf:
        yield np.stack([b[0] for b in buf]), np.array([int(b[1]) for b in buf]), np.array([int(b[2]) for b in buf])


def to_np(a):
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


def timed_epoch(make_iter):
    t0 = time.perf_counter()
    it = make_iter()
    n = n1 = 0
    first = None
    shape = dtype = None
    for b in it:
        imgs, labels = b[0], b[1]
        if first is None:
            first = time.perf_counter()
            n1 = len(labels)
            shape, dtype = list(imgs.shape), str(imgs.dtype)
        n += len(labels)
    t1 = time.perf_counter()
    del it
    rate = (n - n1) / (t1 - first) if first is not None and t1 > first else float("nan")
    return {"samples": n, "first_batch_s": round(first - t0, 3) if first else None,
            "epoch_s": round(t1 - t0, 3), "samples_per_s": round(rate, 1),
            "batch_shape": shape, "dtype": dtype}


# -- files --------------------------------------------------------------------------------------


def files_of(d):
    out = []
    for root, _, files in os.walk(d):
        for f in files:
            out.append(os.path.relpath(os.path.join(root, f), d))
    return sorted(out)


def size_of(d, files=None):
    return sum(os.path.getsize(os.path.join(d, f)) for f in (files or files_of(d)))


def copy_files(src, files, dst):
    shutil.rmtree(dst, ignore_errors=True)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
        shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


def flip_one_byte(d, files, where=0.6):
    """XOR 0xFF the byte at 60% (+ 101 bytes) of the largest file that is not .json. (60% of a
    tar file, a multiple of 10240 bytes, is a multiple of 512: a tar header's first byte or a
    member's at a multiple of 512; 101 moves every system's offset off such alignments.)"""
    data = [f for f in files if not f.endswith(".json")]
    big = max(data, key=lambda f: os.path.getsize(os.path.join(d, f)))
    path = os.path.join(d, big)
    size = os.path.getsize(path)
    at = min(size - 1, int(size * where) + 101)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0xFF]))
    out = {"file": big, "file_bytes": size, "offset": at, "byte_was": b[0]}
    if big.endswith(".tar"):
        out["tar_part"] = tar_part(path, at)
    return out


def tar_part(path, at):
    """What of a tar file holds byte `at`: a member's data, a header or padding."""
    import tarfile

    try:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.offset <= at < m.offset_data:
                    return f"header of {m.name}"
                if m.offset_data <= at < m.offset_data + m.size:
                    return f"data of {m.name}"
                if m.offset_data + m.size <= at < m.offset_data + -(-m.size // 512) * 512:
                    return f"padding after {m.name}"
    except Exception as e:  # noqa: BLE001 - only a description
        return f"unreadable: {e}"
    return "end-of-archive padding"


def digests(batches):
    out = {}
    for imgs, labels, keys in batches:
        imgs, labels, keys = to_np(imgs), to_np(labels), to_np(keys)
        for i in range(len(keys)):
            out[int(keys[i])] = (zlib.crc32(np.ascontiguousarray(imgs[i]).tobytes()), int(labels[i]))
    return out


def exc_text(e):
    """An exception's type and first line (its arguments, or its cause's, if it has no text)."""
    def first(x):
        lines = [ln.strip() for ln in str(x).splitlines() if ln.strip()]
        return lines[0] if lines else ""
    text = first(e)
    if not text and e.args:
        text = first(", ".join(str(a) for a in e.args if a is not None))
    cause = e.__cause__ or e.__context__
    if cause is not None:
        text += f" (from {type(cause).__name__}: {first(cause)})"
    return f"{type(e).__name__}: {text}"[:300]


def in_child(fn, timeout):
    """fn() in a forked process: ("ok", value), ("error", text) or ("hang", text)."""
    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)

    def run():
        try:
            w.send(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - reported
            w.send(("error", exc_text(e)))
        w.close()

    p = ctx.Process(target=run)
    p.start()
    w.close()
    if r.poll(timeout):
        try:
            out = r.recv()
        except EOFError:
            out = ("error", f"reader process died (exit code {p.exitcode})")
    else:
        out = ("hang", f"no result in {timeout} s")
    p.join(5)
    if p.is_alive():
        p.kill()
        p.join()
    return out


FLIP_AT = [0.6, 0.4, 0.8, 0.5, 0.7]


def flip_test(name, ds_dir, files, read_plain, work, flips=1):
    """The flipped-byte result for a dataset made of `files` in `ds_dir`: one damaged copy per
    flip (at 60%, then 40%, 80%, 50%, 70% of the largest file), each read for an epoch."""
    clean_dir = os.path.join(work, f"flip-clean-{name}")
    bad_dir = os.path.join(work, f"flip-bad-{name}")
    copy_files(ds_dir, files, clean_dir)
    results = []
    try:
        st, clean = in_child(lambda: digests(read_plain(clean_dir)), FLIP_TIMEOUT)
        if st != "ok":
            return {"flip": f"clean read failed: {clean}"}
        for at in FLIP_AT[:flips]:
            copy_files(ds_dir, files, bad_dir)
            where = flip_one_byte(bad_dir, files, at)
            st, bad = in_child(lambda: digests(read_plain(bad_dir)), FLIP_TIMEOUT)
            if st == "error":
                text = f"error: {bad}"
            elif st == "hang":
                text = f"hang: {bad}"
            else:
                differ = sum(1 for k, v in bad.items() if k in clean and clean[k] != v)
                missing = sum(1 for k in clean if k not in bad)
                extra = sum(1 for k in bad if k not in clean)
                if differ or missing or extra:
                    text = f"silent: {differ} of {len(clean)} samples differ"
                    if missing:
                        text += f", {missing} missing"
                    if extra:
                        text += f", {extra} unknown"
                else:
                    text = "silent: no visible change"
            results.append({"flip": text, **where})
            shutil.rmtree(bad_dir, ignore_errors=True)
    finally:
        shutil.rmtree(clean_dir, ignore_errors=True)
        shutil.rmtree(bad_dir, ignore_errors=True)
    out = dict(results[0])
    if len(results) > 1:
        out["flip"] = " / ".join(r["flip"] for r in results)
        out["flips"] = results
    return out


# -- the systems --------------------------------------------------------------------------------


class Variant:
    """One system's way of storing the samples: convert() writes `dir`, torch_loader() and
    plain(dir) read it."""

    system = ""
    name = ""

    def __init__(self, a, items, photos, work):
        self.a, self.items, self.photos, self.work = a, items, photos, work
        self.dir = os.path.join(work, f"{self.system}-{self.name}")
        self.note = ""

    def convert(self):
        raise NotImplementedError

    def torch_loader(self, workers=None):
        """A function making an iterator of (images, labels[, keys]) torch batches."""
        raise NotImplementedError

    def plain(self, d, shuffle=False):
        """(images, labels, keys) numpy batches of dataset folder d, in this process."""
        raise NotImplementedError

    def workers(self, n):
        return self.a.workers if n is None else n

    def close(self):
        pass


class Prep(Variant):
    system = "prep"

    def __init__(self, codec, *args):
        self.codec = codec
        self.name = codec
        super().__init__(*args)

    def convert(self):
        cmd = [self.a.prep, "convert", self.photos, "--out", self.dir, "--size", str(SIZE),
               "--codec", self.codec, "--test-fraction", "0", "--quiet", "--json"]
        if self.codec == "jpeg":
            cmd += ["--quality", "90"]
        self.note = " ".join(cmd[1:2] + cmd[3:])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"prep convert failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        try:
            rep = json.loads(r.stdout)
            if rep.get("rejects"):
                self.note += f"; {len(rep['rejects'])} rejects"
        except ValueError:
            pass

    def torch_loader(self, workers=None):
        import prep.torch as pt

        ds = pt.ShardDataset(self.dir, "train", batch_size=self.a.batch, shuffle=True, seed=0)
        self._epoch = getattr(self, "_epoch", -1) + 1
        ds.set_epoch(self._epoch)
        w = self.workers(workers)
        # No worker processes: the batches are read by prep's threads (all cores) in this one.
        return lambda: iter(pt.DataLoader(ds, num_workers=w, timeout=LOADER_TIMEOUT if w else 0))

    def plain(self, d, shuffle=False):
        import prep

        split = prep.open(d)["train"]
        n = 0
        for imgs, labels in split.batches(self.a.batch, shuffle=shuffle, seed=0):
            keys = np.arange(n, n + len(labels))  # file order: the position is the key
            n += len(labels)
            yield imgs, labels, keys


def import_streaming():
    """Import MosaicML Streaming. It imports, when it is imported, names of two packages that
    none of its code used here needs: transformers (BatchFeature / BatchEncoding for
    StreamingDataLoader's batch-size checks, AutoTokenizer for its C4 and Pile datasets) and
    torchvision (VisionDataset and to_tensor for its CIFAR-10 / ImageNet datasets). Where one
    is not installed (the GPU host has neither), plain stand-ins for those names are put in
    sys.modules for the import only and taken out afterwards; MDSWriter and StreamingDataset
    never reach them. Returns the names of the packages stood in for."""
    import importlib.util
    from collections import UserDict

    def missing(name):
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    class BatchFeature(UserDict):
        pass

    class BatchEncoding(UserDict):
        pass

    class AutoTokenizer:
        @classmethod
        def from_pretrained(cls, *a, **k):
            raise ImportError("transformers is not installed")

    class VisionDataset:
        pass

    def to_tensor(*a, **k):
        raise ImportError("torchvision is not installed")

    stand_ins = {
        "transformers": {"transformers": {}, "transformers.feature_extraction_utils": {"BatchFeature": BatchFeature},
                         "transformers.tokenization_utils_base": {"BatchEncoding": BatchEncoding},
                         "transformers.models": {}, "transformers.models.auto": {},
                         "transformers.models.auto.tokenization_auto": {"AutoTokenizer": AutoTokenizer}},
        "torchvision": {"torchvision": {}, "torchvision.datasets": {"VisionDataset": VisionDataset},
                        "torchvision.transforms": {},
                        "torchvision.transforms.functional": {"to_tensor": to_tensor}},
    }
    used, added = [], []
    for pkg, mods in stand_ins.items():
        if pkg in sys.modules or not missing(pkg):
            continue
        used.append(pkg)
        for name, attrs in mods.items():
            m = types.ModuleType(name)
            m.__path__ = []
            m.__dict__.update(attrs)
            sys.modules[name] = m
            added.append(name)
    try:
        import streaming  # noqa: F401
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return used


_MDS_CLASS = None


def _mds_class():
    """A StreamingDataset whose samples are (C x H x W uint8 array, label, key)."""
    global _MDS_CLASS
    if _MDS_CLASS is None:
        from streaming import StreamingDataset

        class MDSPhotos(StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                x = s["x"]
                if isinstance(x, (bytes, bytearray, memoryview)):
                    x = jpeg_chw(x)
                return x, s["y"], s["k"]

        _MDS_CLASS = MDSPhotos
    return _MDS_CLASS


def _mds_clean():
    try:
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()
    except Exception:  # noqa: BLE001 - best effort
        pass


class MDS(Variant):
    system = "mds"

    def __init__(self, name, *args):
        self.name = name
        super().__init__(*args)
        self.compression = "zstd" if name.startswith("zstd") else None
        self.hashes = ["xxh64"] if name == "zstd-xxh64" else []
        self.kind = "jpeg" if name == "jpeg" else "pixels"
        self._ds = None

    def convert(self):
        from streaming import MDSWriter

        xcol = "bytes" if self.kind == "jpeg" else f"ndarray:uint8:3,{SIZE},{SIZE}"
        columns = {"x": xcol, "y": "int", "k": "int"}
        limit = max(1 << 20, len(self.items) * sample_bytes(self.kind) // 32)
        fn = job_jpeg if self.kind == "jpeg" else job_pixels
        with MDSWriter(out=self.dir, columns=columns, compression=self.compression,
                       hashes=self.hashes or None, size_limit=limit, progress_bar=False) as w:
            for k, y, x in pooled(fn, self.items):
                w.write({"x": x, "y": y, "k": k})
        self.note = f"MDSWriter(columns x={xcol}, compression={self.compression}, hashes={self.hashes}, size_limit={limit})"

    def _dataset(self, d, shuffle):
        _mds_clean()
        return _mds_class()(local=d, remote=None, shuffle=shuffle, batch_size=self.a.batch,
                            validate_hash="xxh64" if self.hashes else None)

    def torch_loader(self, workers=None):
        import torch.utils.data as tud

        if self._ds is None:
            self._ds = self._dataset(self.dir, True)
        ds = self._ds
        return lambda: iter(tud.DataLoader(ds, batch_size=self.a.batch, num_workers=self.workers(workers),
                                           collate_fn=collate, timeout=LOADER_TIMEOUT))

    def plain(self, d, shuffle=False):
        ds = self._dataset(d, shuffle)
        yield from np_batches(iter(ds), self.a.batch)

    def close(self):
        self._ds = None
        _mds_clean()


def _wds_tuple_jpg(s):
    return s["jpg"].transpose(2, 0, 1), int(s["cls"]), int(s["id"])


def _wds_tuple_npy(s):
    return s["npy"], int(s["cls"]), int(s["id"])


def _wds_collate(samples):
    return (np.stack([s[0] for s in samples]), np.array([s[1] for s in samples]),
            np.array([s[2] for s in samples]))


class WDS(Variant):
    system = "wds"

    def __init__(self, name, *args):
        self.name = name
        super().__init__(*args)

    def convert(self):
        import webdataset as wds

        os.makedirs(self.dir)
        per = max(1, math.ceil(len(self.items) / 32))
        fn = job_jpeg if self.name == "jpg" else job_pixels
        with wds.ShardWriter(os.path.join(self.dir, "shard-%06d.tar"), maxcount=per, verbose=0) as w:
            for k, y, x in pooled(fn, self.items):
                w.write({"__key__": f"{k:08d}", self.name: x, "cls": y, "id": k})
        self.note = f"ShardWriter(maxcount={per}) .{self.name} + .cls + .id"

    def _urls(self, d):
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))

    def _pipeline(self, d, shuffle):
        import webdataset as wds

        urls = self._urls(d)
        ds = wds.WebDataset(urls, shardshuffle=len(urls) if shuffle else False, empty_check=False)
        if shuffle:
            ds = ds.shuffle(1000)
        ds = ds.decode("rgb8") if self.name == "jpg" else ds.decode()
        return ds.map(_wds_tuple_jpg if self.name == "jpg" else _wds_tuple_npy)

    def torch_loader(self, workers=None):
        import torch.utils.data as tud

        ds = self._pipeline(self.dir, True).batched(self.a.batch, collation_fn=_wds_collate)
        return lambda: iter(tud.DataLoader(ds, batch_size=None, num_workers=self.workers(workers),
                                           timeout=LOADER_TIMEOUT))

    def plain(self, d, shuffle=False):
        yield from np_batches(iter(self._pipeline(d, shuffle)), self.a.batch)


def _lit_pixels(inp):
    # litdata.optimize's workers are spawned (its default): SIZE comes with each input.
    global SIZE
    SIZE = inp[3]
    k, y, x = job_pixels(inp[:3])
    return {"x": x, "y": y, "k": k}


def _lit_jpeg(inp):
    global SIZE
    SIZE = inp[3]
    k, y, x = job_jpeg(inp[:3])
    return {"x": x, "y": y, "k": k}


def _lit_item(s):
    x = s["x"]
    if isinstance(x, (bytes, bytearray, memoryview)):
        x = jpeg_chw(x)
    return x, s["y"], s["k"]


class Lit(Variant):
    system = "litdata"

    def __init__(self, name, *args):
        self.name = name
        super().__init__(*args)
        self.kind = "jpeg" if name == "jpeg" else "pixels"

    def convert(self):
        import litdata

        chunk = max(1 << 20, len(self.items) * sample_bytes(self.kind) // 32)
        kw = dict(compression="zstd") if self.name == "pixels-zstd" else {}
        method = mp.get_start_method()
        try:
            litdata.optimize(fn=_lit_jpeg if self.kind == "jpeg" else _lit_pixels,
                             inputs=[[p, y, k, SIZE] for p, y, k in self.items], output_dir=self.dir,
                             chunk_bytes=chunk, num_workers=CPUS, verbose=False, **kw)
        finally:
            # optimize sets the process's start method to spawn: the DataLoaders after it keep
            # Linux's default (fork), as in a training script that reads a dataset made before.
            mp.set_start_method(method, force=True)
        self.note = f"optimize(num_workers={CPUS}, chunk_bytes={chunk}{', compression=zstd' if kw else ''})"

    def _dataset(self, d, shuffle):
        import litdata

        return litdata.StreamingDataset(d, shuffle=shuffle, transform=_lit_item)

    def torch_loader(self, workers=None):
        import litdata

        ds = self._dataset(self.dir, True)
        return lambda: iter(litdata.StreamingDataLoader(ds, batch_size=self.a.batch,
                                                        num_workers=self.workers(workers),
                                                        collate_fn=collate, timeout=LOADER_TIMEOUT))

    def plain(self, d, shuffle=False):
        yield from np_batches(iter(self._dataset(d, shuffle)), self.a.batch)


def prep_has_jpeg(prep_bin):
    try:
        r = subprocess.run([prep_bin, "convert", "--help"], capture_output=True, text=True)
        return "jpeg" in r.stdout
    except OSError:
        return False


def importable(system):
    """None, or why the system cannot run."""
    try:
        if system == "prep":
            import prep  # noqa: F401
        elif system == "mds":
            global STAND_INS
            STAND_INS = import_streaming()
        elif system == "wds":
            import webdataset  # noqa: F401
        elif system == "litdata":
            import litdata  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported
        return f"import failed: {type(e).__name__}: {e}"
    return None


# -- one variant --------------------------------------------------------------------------------


def run_variant(v, a, use_torch):
    try:
        return _run_variant(v, a, use_torch)
    finally:
        if not a.keep:
            shutil.rmtree(v.dir, ignore_errors=True)


def _run_variant(v, a, use_torch):
    row = {"system": v.system, "variant": v.name}
    t_start = time.perf_counter()
    shutil.rmtree(v.dir, ignore_errors=True)
    log(f"[{v.system} {v.name}] convert")
    t0 = time.perf_counter()
    v.convert()
    row["convert_s"] = round(time.perf_counter() - t0, 2)
    files = files_of(v.dir)
    row["files"] = len(files)
    row["bytes"] = size_of(v.dir, files)
    row["note"] = v.note
    rounds = []
    log(f"[{v.system} {v.name}] read x{a.rounds}")
    for r in range(a.rounds):
        if use_torch:
            make = v.torch_loader()
        else:
            make = lambda: v.plain(v.dir, shuffle=True)  # noqa: E731
        rounds.append(timed_epoch(make))
    del make
    v.close()
    row["rounds"] = rounds
    best = max(rounds, key=lambda x: x["samples_per_s"] if x["samples_per_s"] == x["samples_per_s"] else -1)
    row["samples_per_s"] = best["samples_per_s"]
    row["first_epoch_samples_per_s"] = rounds[0]["samples_per_s"]
    row["first_batch_s"] = rounds[0]["first_batch_s"]
    row["samples_per_epoch"] = rounds[0]["samples"]
    if rounds[0]["samples"] != len(v.items):
        row["warning"] = f"an epoch gave {rounds[0]['samples']} samples, not {len(v.items)}"
    for w in (a.also_workers if use_torch else []):
        if w == 0 and v.system != "prep":
            continue  # a peer without workers reads on one core: not a setting anyone uses
        log(f"[{v.system} {v.name}] read x{a.rounds} with {w} workers")
        more = [timed_epoch(v.torch_loader(w)) for _ in range(a.rounds)]
        row.setdefault("also", {})[str(w)] = {
            "rounds": more, "samples_per_s": max(x["samples_per_s"] for x in more),
            "first_epoch_samples_per_s": more[0]["samples_per_s"],
            "first_batch_s": more[0]["first_batch_s"]}
    row["bytes_after_read"] = size_of(v.dir)
    if not a.no_flip:
        log(f"[{v.system} {v.name}] flipped byte")
        t0 = time.perf_counter()
        row.update(flip_test(f"{v.system}-{v.name}", v.dir, files, v.plain, a.work, a.flips))
        row["flip_s"] = round(time.perf_counter() - t0, 1)
    row["variant_s"] = round(time.perf_counter() - t_start, 1)
    return row


# -- the report ---------------------------------------------------------------------------------


def table(rows):
    base = next((r.get("samples_per_s") for r in rows
                 if r["system"] == "prep" and r["variant"] == "zstd" and r.get("samples_per_s")), None)
    out = ["| system | variant | bytes on disk | MiB | convert s | samples/s (best) | 1st epoch | "
           "x prep-zstd | 1st batch s | flipped byte |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['system']} | {r.get('variant', '')} | | | | | | | | failed: "
                       f"{r['error'].splitlines()[0][:120]} |")
            continue
        sps = r.get("samples_per_s")
        ratio = f"{sps / base:.2f}" if base and sps else ""
        out.append(f"| {r['system']} | {r['variant']} | {r['bytes']:,} | {r['bytes'] / 2**20:.1f} | "
                   f"{r['convert_s']:.1f} | {sps:,.0f} | {r['first_epoch_samples_per_s']:,.0f} | "
                   f"{ratio} | {r['first_batch_s']} | {r.get('flip', '')} |")
        for w, m in r.get("also", {}).items():
            how = f"{w} workers" if w != "0" else f"0 workers ({CPUS} threads)"
            sps = m["samples_per_s"]
            ratio = f"{sps / base:.2f}" if base and sps else ""
            out.append(f"| {r['system']} | {r['variant']}, {how} | | | | {sps:,.0f} | "
                       f"{m['first_epoch_samples_per_s']:,.0f} | {ratio} | {m['first_batch_s']} | |")
    return "\n".join(out)


def main():
    global SIZE, FLIP_TIMEOUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photos", required=True)
    ap.add_argument("--prep", default=".dev/prep", help="the prep binary")
    ap.add_argument("--work", default="/tmp/peers-work")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--count", type=int, default=None, help="use only the first N photos")
    ap.add_argument("--only", default=None, help="systems, e.g. prep,mds (of %s)" % ",".join(SYSTEMS))
    ap.add_argument("--variants", default=None, help="only these variants, e.g. zstd,jpg")
    ap.add_argument("--out", default="peers.json")
    ap.add_argument("--no-torch", action="store_true", help="no DataLoader: iterate in this process")
    ap.add_argument("--no-flip", action="store_true", help="skip the flipped-byte test")
    ap.add_argument("--flips", type=int, default=1, choices=range(1, 6),
                    help="flipped-byte tests per variant, each its own damaged copy (60%%, 40%%, 80%%, 50%%, 70%%)")
    ap.add_argument("--flip-timeout", type=int, default=FLIP_TIMEOUT)
    ap.add_argument("--keep", action="store_true", help="keep the datasets in --work")
    ap.add_argument("--also-workers", default="", type=lambda t: [int(x) for x in t.split(",") if x],
                    help="more worker counts to read each variant with, e.g. 0,16 (0: prep only, "
                         "its reader's threads in the main process)")
    a = ap.parse_args()
    SIZE = a.size
    FLIP_TIMEOUT = a.flip_timeout
    a.prep = os.path.abspath(a.prep)
    a.work = os.path.abspath(a.work)
    os.makedirs(a.work, exist_ok=True)
    systems = a.only.split(",") if a.only else SYSTEMS
    wanted = set(a.variants.split(",")) if a.variants else None
    items, classes, total = list_photos(a.photos, a.count)
    photos = a.photos if len(items) == total else subset_folder(items, classes, a.work)
    use_torch = not a.no_torch
    if use_torch:
        import torch
        torch_version = torch.__version__
    else:
        torch_version = None
    import PIL

    meta = {"photos": len(items), "classes": len(classes), "size": SIZE, "workers": a.workers,
            "batch": a.batch, "rounds": a.rounds, "cpus": CPUS, "torch": torch_version,
            "numpy": np.__version__, "pillow": PIL.__version__,
            "python": sys.version.split()[0], "mode": "torch DataLoader" if use_torch else "no-torch"}
    log(json.dumps(meta))

    args = (a, items, photos, a.work)
    plan = []
    for s in systems:
        if s == "prep":
            codecs = ["zstd", "pred", "none"] + (["jpeg"] if prep_has_jpeg(a.prep) else [])
            plan += [(s, c, lambda c=c: Prep(c, *args)) for c in codecs]
        elif s == "mds":
            plan += [(s, n, lambda n=n: MDS(n, *args)) for n in ["zstd", "zstd-xxh64", "raw", "jpeg"]]
        elif s == "wds":
            plan += [(s, n, lambda n=n: WDS(n, *args)) for n in ["jpg", "npy"]]
        elif s == "litdata":
            plan += [(s, n, lambda n=n: Lit(n, *args)) for n in ["pixels-zstd", "jpeg"]]
        else:
            raise SystemExit(f"unknown system {s!r} (of {','.join(SYSTEMS)})")
    rows, versions, failed = [], {}, {}
    for s, n, make in plan:
        if wanted and n not in wanted:
            continue
        if s not in versions and s not in failed:
            why = importable(s)
            if why:
                failed[s] = why
                log(f"[{s}] skipped: {why}")
            else:
                mod = {"prep": "prep", "mds": "streaming", "wds": "webdataset", "litdata": "litdata"}[s]
                versions[s] = getattr(sys.modules[mod], "__version__", "?")
        if s in failed:
            row = {"system": s, "variant": n, "error": failed[s]}
        else:
            try:
                row = run_variant(make(), a, use_torch)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                row = {"system": s, "variant": n, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-3000:]}
                log(row["traceback"])
        print(json.dumps({k: v for k, v in row.items() if k != "traceback"}), flush=True)
        rows.append(row)
    meta["versions"] = versions
    if STAND_INS:
        meta["streaming_stand_ins"] = (f"streaming was imported with stand-ins for {', '.join(STAND_INS)} "
                                       "(not installed; names only its unused StreamingDataLoader, "
                                       "text and vision datasets need)")
    md = table(rows)
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "table": md}, f, indent=1)
    print(md, flush=True)


if __name__ == "__main__":
    main()
