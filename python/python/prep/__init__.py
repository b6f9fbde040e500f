"""Read prep shard datasets from Python, with the same Rust reader as ``prep train``.

    >>> import prep
    >>> ds = prep.open("shards/")
    >>> ds.shape, ds.dtype, ds.classes, ds.counts
    >>> train = ds["train"]
    >>> image, label = train[0]                      # C x H x W array, int
    >>> for images, labels in train.batches(512, seed=0, epoch=3):
    ...     ...                                      # [N, C, H, W] and [N] arrays

Every block read is checked against its checksums; a damaged block raises
:class:`DamagedBlockError` naming the shard file and the block (or, with ``skip_damaged=True``,
is skipped and counted). ``prep.torch`` adapts a split to PyTorch's ``DataLoader``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _prep
from ._prep import DamagedBlockError, DatasetError

__all__ = [
    "open",
    "store_traffic",
    "Dataset",
    "Split",
    "Batches",
    "DatasetError",
    "DamagedBlockError",
    "WINDOW_BLOCKS",
]

__version__ = _prep.__version__

#: Blocks whose samples are shuffled together (``prep train``'s shuffle window).
WINDOW_BLOCKS = _prep.WINDOW_BLOCKS

#: Decoded blocks kept for random access, in bytes (at least one block is kept).
DEFAULT_CACHE_BYTES = 64 << 20

_DTYPES = {"u8": np.uint8, "u16": np.uint16, "f16": np.float16, "f32": np.float32}


def open(path: "os.PathLike[str] | str", cache_bytes: int = DEFAULT_CACHE_BYTES) -> "Dataset":
    """Open the prep dataset in directory ``path`` (or its ``manifest.json``), or at a URL:
    ``s3://bucket/ds``, ``gs://bucket/ds``, ``az://container/ds``, ``http(s)://host/ds``, with
    each store's credentials from its usual environment variables.

    The manifest is read and checked (its own checksum, then its consistency). A missing
    directory raises :class:`FileNotFoundError`; a directory that is not a prep shard dataset, or
    a damaged manifest, raises :class:`DatasetError`. ``cache_bytes`` bounds the decoded blocks
    each split keeps for random access.
    """
    return Dataset(path, cache_bytes=cache_bytes)


def store_traffic() -> Dict[str, int]:
    """What this process has read from object stores and HTTP servers so far: ranged reads
    (``requests``; the HEADs that find objects aside), the bytes they brought (``bytes``), and
    reads the local block cache served instead (``cache_hits``). The difference of two calls is
    what happened between them, one epoch's traffic say."""
    requests, nbytes, hits = _prep._store_traffic()
    return {"requests": requests, "bytes": nbytes, "cache_hits": hits}


def _check_share(rank: int, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer of at least 1, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")


def _check_seed(seed: int) -> int:
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed


class Dataset:
    """An open prep dataset: its manifest, and its splits by name (``ds["train"]``)."""

    def __init__(self, path: "os.PathLike[str] | str", cache_bytes: int = DEFAULT_CACHE_BYTES):
        self._native = _prep.NativeDataset(os.fspath(path))
        self.manifest: Dict[str, Any] = json.loads(self._native.manifest_json())
        self.cache_bytes = int(cache_bytes)
        self._splits: Dict[str, Split] = {}

    @property
    def path(self) -> str:
        return self._native.path

    @property
    def shape(self) -> Tuple[int, ...]:
        """Shape of one sample, channels first (``(C, H, W)`` or ``(C, D, H, W)``)."""
        return tuple(self.manifest["sample"]["shape"])

    @property
    def dtype(self) -> np.dtype:
        """NumPy dtype of the stored values: uint8, uint16, float16 or float32."""
        return np.dtype(_DTYPES[self.manifest["sample"]["dtype"]])

    @property
    def classes(self) -> List[str]:
        return list(self.manifest["classes"])

    @property
    def fields(self) -> List[Dict[str, Any]]:
        """What each sample carries beside its image and class (format version 3): one dict per
        field with ``name``, ``kind`` (``mask``, ``labels`` or ``values``), ``dtype``, ``shape``
        and ``names``; empty for datasets of images and classes only."""
        return [dict(f) for f in self.manifest.get("fields", [])]

    @property
    def num_classes(self) -> int:
        return len(self.manifest["classes"])

    @property
    def splits(self) -> List[str]:
        return list(self.manifest["splits"])

    @property
    def counts(self) -> Dict[str, int]:
        """Samples per split."""
        return {k: v["samples"] for k, v in self.manifest["splits"].items()}

    @property
    def class_counts(self) -> Dict[str, List[int]]:
        """Samples per class, per split."""
        return {k: list(v["class_counts"]) for k, v in self.manifest["splits"].items()}

    @property
    def mean(self) -> List[float]:
        """Per-channel mean of value / max (u8: /255, u16: /65535; floats as stored) over the
        train split (or the first split): what ``prep train`` normalises with."""
        return list(self.manifest["mean"])

    @property
    def std(self) -> List[float]:
        return list(self.manifest["std"])

    @property
    def divisor(self) -> float:
        """What a stored value is divided by before ``mean``/``std`` apply (255 for u8, 65535
        for u16, 1 for floats)."""
        return {"u8": 255.0, "u16": 65535.0}.get(self.manifest["sample"]["dtype"], 1.0)

    @property
    def provenance(self) -> Dict[str, Any]:
        """Tool version, command line and source of the data."""
        return self.manifest["provenance"]

    @property
    def codec(self) -> str:
        return self.manifest["codec"]["name"]

    @property
    def block_samples(self) -> int:
        return self.manifest["block_samples"]

    @property
    def format_version(self) -> int:
        return self.manifest["version"]

    def split(self, name: str, cache_bytes: Optional[int] = None) -> "Split":
        """Open split ``name`` (its shard headers and indexes are read and checked)."""
        if name not in self.manifest["splits"]:
            raise KeyError(
                f"{self.path}: no split {name!r} (it has: {', '.join(self.splits)})"
            )
        if cache_bytes is not None:
            return Split(self, name, cache_bytes)
        if name not in self._splits:
            self._splits[name] = Split(self, name, self.cache_bytes)
        return self._splits[name]

    def __getitem__(self, name: str) -> "Split":
        return self.split(name)

    def __contains__(self, name: object) -> bool:
        return name in self.manifest["splits"]

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.manifest["splits"])

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.shape))
        counts = ", ".join(f"{k}: {v}" for k, v in self.counts.items())
        return f"prep.Dataset({self.path!r}, {shape} {self.dtype}, {self.num_classes} classes, {counts})"


def _meta_dict(a: np.ndarray) -> Dict[str, Any]:
    """One sample's metadata field (its zero-padded JSON bytes) as a dict."""
    text = a.tobytes().rstrip(b"\0")
    return json.loads(text) if text else {}


def _meta_list(a: np.ndarray) -> List[Dict[str, Any]]:
    return [_meta_dict(row) for row in a]


class Split:
    """One split of a dataset: ``len(split)``, ``split[i]`` by random access, ``split.batches()``
    in ``prep train``'s order."""

    def __init__(self, dataset: Dataset, name: str, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.dataset = dataset
        self.name = name
        self._native = dataset._native.open_split(name, int(cache_bytes))
        self.shape: Tuple[int, ...] = dataset.shape
        self.dtype: np.dtype = dataset.dtype
        self._field_names: List[str] = self._native.field_names()
        # Metadata fields come out as dicts (one sample) or lists of dicts (a batch).
        self._meta = [f["kind"] == "meta" for f in dataset.fields]

    def _fields(self, fields: Sequence[Any], batch: bool, raw: bool = False) -> Dict[str, Any]:
        out = {}
        for name, meta, f in zip(self._field_names, self._meta, fields):
            a = np.asarray(f)
            out[name] = (_meta_list(a) if batch else _meta_dict(a)) if meta and not raw else a
        return out

    def __len__(self) -> int:
        return len(self._native)

    def __getitem__(self, i: int) -> Any:
        """Sample ``i`` (negative counts from the end) as ``(array C x H x W, label)``, or, for
        a dataset whose samples carry fields, a dict ``{"image": ..., "class": ..., FIELD: ...}``
        in the manifest's order of fields. Only the block holding it is read and checked;
        recently decoded blocks are cached."""
        if isinstance(i, slice):
            raise TypeError("slices are not supported: use split.take(indices)")
        pixels, label, fields = self._native.get(i.__index__())
        if not self._field_names:
            return np.asarray(pixels), label
        out: Dict[str, Any] = {"image": np.asarray(pixels), "class": label}
        out.update(self._fields(fields, batch=False))
        return out

    def __iter__(self) -> Iterator[Tuple[np.ndarray, int]]:
        """Every sample in file order."""
        for i in range(len(self)):
            yield self[i]

    @property
    def num_blocks(self) -> int:
        return len(self._native.block_sizes)

    @property
    def block_sizes(self) -> List[int]:
        return self._native.block_sizes

    def cache_info(self) -> Dict[str, int]:
        hits, misses = self._native.cache_stats()
        return {"hits": hits, "misses": misses}

    def take(self, indices: Sequence[int], threads: Optional[int] = None) -> Any:
        """The samples at ``indices``, in that order: ``(images[N, ...], labels[N])``, or, for a
        dataset whose samples carry fields, a dict of arrays with ``image``, ``class`` and each
        field (``[N, ...]``). Each block holding any of them is read and checked once, on
        ``threads`` threads."""
        idx = np.asarray(indices, dtype=np.int64).ravel().tolist()
        pixels, labels, fields = self._native.take(idx, threads)
        if not self._field_names:
            return np.asarray(pixels), np.asarray(labels)
        out: Dict[str, Any] = {"image": np.asarray(pixels), "class": np.asarray(labels)}
        out.update(self._fields(fields, batch=True))
        return out

    def order(self, seed: int = 0, epoch: int = 0, shuffle: bool = True, rank: int = 0,
              world_size: int = 1) -> np.ndarray:
        """Indices (file order) of the samples in the order ``batches()`` streams them for
        these arguments, with no damaged block skipped."""
        _check_share(rank, world_size)
        return np.asarray(self._native.order(_check_seed(seed), int(epoch), bool(shuffle), rank, world_size))

    def num_samples(self, seed: int = 0, epoch: int = 0, shuffle: bool = True, rank: int = 0,
                    world_size: int = 1) -> int:
        """Samples in rank ``rank``'s share of the epoch."""
        _check_share(rank, world_size)
        return self._native.share_samples(_check_seed(seed), int(epoch), bool(shuffle), rank, world_size)

    def num_batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                    rank: int = 0, world_size: int = 1, drop_last: bool = False) -> int:
        """Batches ``batches()`` yields for these arguments (no damaged block skipped)."""
        n = self.num_samples(seed, epoch, shuffle, rank, world_size)
        return n // batch_size if drop_last else -(-n // batch_size)

    def batches(self, batch_size: int, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                rank: int = 0, world_size: int = 1, drop_last: bool = False,
                threads: Optional[int] = None, start: int = 0,
                skip_damaged: bool = False) -> "Batches":
        """Iterate over ``(images[N, C, H, W], labels[N])`` batches of one epoch; for a dataset
        whose samples carry fields, dicts of arrays (``image``, ``class`` and each field with a
        leading batch axis, as ``take`` gives them).

        Order: ``prep train``'s (blocks permuted by ``(seed, epoch)``, samples shuffled within
        windows of ``WINDOW_BLOCKS`` blocks); ``shuffle=False`` is file order. With
        ``world_size`` > 1 the epoch's block order is dealt out among the ranks: rank ``r`` gets
        every ``world_size``-th block from position ``r`` and shuffles and batches them on its
        own, so the ranks' shares are disjoint and together hold every sample once (with
        ``drop_last=False``). Rank 0 of 1 with ``drop_last=True`` is exactly ``prep train``'s
        stream.

        Blocks are read, checked and decoded on ``threads`` Rust threads (default: every core)
        without the GIL; at most four batches and a bounded number of blocks are held ahead.
        ``start`` resumes at that batch (the batches before it are not decoded, window by
        window). A damaged block raises :class:`DamagedBlockError`, or with
        ``skip_damaged=True`` is left out and counted in ``Batches.skipped``.
        """
        _check_share(rank, world_size)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if start < 0:
            raise ValueError(f"start must not be negative, got {start}")
        return Batches(self, dict(batch_size=batch_size, shuffle=bool(shuffle),
                                  seed=_check_seed(seed), epoch=int(epoch), rank=rank,
                                  world_size=world_size, drop_last=bool(drop_last)),
                       start=int(start), threads=threads, skip_damaged=bool(skip_damaged))

    def resume(self, state: Dict[str, Any], threads: Optional[int] = None,
               skip_damaged: bool = False) -> "Batches":
        """The batches after those counted in ``state`` (from ``Batches.state_dict()``)."""
        args = {k: state[k] for k in ("batch_size", "shuffle", "seed", "epoch", "rank",
                                      "world_size", "drop_last")}
        return self.batches(**args, threads=threads, start=state["position"],
                            skip_damaged=skip_damaged)

    def __repr__(self) -> str:
        return f"prep.Split({self.name!r}, {len(self)} samples, {'x'.join(map(str, self.shape))} {self.dtype})"


class Batches:
    """An iterator of ``(images, labels)`` NumPy batches produced by Rust threads (dicts of
    arrays for datasets whose samples carry fields).

    ``position`` is the number of batches of this epoch share done (those skipped by ``start``
    included); ``state_dict()`` records it, and ``Split.resume(state)`` continues exactly there.
    """

    def __init__(self, split: Split, args: Dict[str, Any], start: int, threads: Optional[int],
                 skip_damaged: bool):
        self._native = None
        self._damaged_at_close: List[str] = []
        self.split = split
        self._args = args
        self.position = start
        self.skip_damaged = skip_damaged
        # Metadata as the stored bytes (uint8 arrays), for prep.torch's shared-memory ring.
        self._raw_meta = False
        self._native = split._native.batches(
            args["batch_size"], args["shuffle"], args["seed"], args["epoch"], args["rank"],
            args["world_size"], args["drop_last"], start, threads, skip_damaged)

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> Any:
        if self._native is None:
            raise StopIteration
        got = self._native.next()
        if got is None:
            raise StopIteration
        pixels, labels, fields, index = got
        self.position = index + 1
        if not self.split._field_names:
            return np.asarray(pixels), np.asarray(labels)
        out = {"image": np.asarray(pixels), "class": np.asarray(labels)}
        out.update(self.split._fields(fields, batch=True, raw=self._raw_meta))
        return out

    def __len__(self) -> int:
        """Batches in this share of the epoch (from batch 0, whatever ``start`` was)."""
        a = self._args
        return self.split.num_batches(a["batch_size"], a["shuffle"], a["seed"], a["epoch"],
                                      a["rank"], a["world_size"], a["drop_last"])

    @property
    def damaged(self) -> List[str]:
        """The damaged blocks skipped so far, as error messages naming shard file and block."""
        return self._native.damaged() if self._native is not None else self._damaged_at_close

    @property
    def skipped(self) -> int:
        """Number of damaged blocks skipped so far (``skip_damaged=True``)."""
        return len(self.damaged)

    def state_dict(self) -> Dict[str, Any]:
        return dict(self._args, position=self.position)

    def close(self) -> None:
        """Stop the reader threads and free their buffers (also done at the end and on error)."""
        if self._native is not None:
            self._damaged_at_close = self._native.damaged()
            self._native.close()
            self._native = None

    def __enter__(self) -> "Batches":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _round_robin(counts: Sequence[int], n: int, first: int = 0) -> Tuple[List[int], int]:
    """The first ``n`` items that a DataLoader takes from workers holding ``counts`` batches,
    asking them in turn from worker ``first`` on and passing over those that have ended: the
    number taken from each, and the worker the next item comes from (-1 if none)."""
    k = len(counts)
    taken = [0] * k
    left = [c for c in counts]
    w = first % k if k else 0
    got = 0
    while got < n:
        if not any(left):
            break
        while left[w] == 0:
            w = (w + 1) % k
        taken[w] += 1
        left[w] -= 1
        got += 1
        w = (w + 1) % k
    if any(left):
        while left[w] == 0:
            w = (w + 1) % k
        return taken, w
    return taken, -1


def worker_plan(split: Split, batch_size: int, *, shuffle: bool, seed: int, epoch: int,
                drop_last: bool, rank: int, world_size: int, num_workers: int,
                position: int = 0, equal_batches: bool = False) -> Dict[str, Any]:
    """How rank ``rank``'s epoch is spread over ``num_workers`` DataLoader workers.

    Shares are ``rank * num_workers + worker`` of ``world_size * num_workers``: each worker
    decodes only its own blocks, and all workers of all ranks together read every sample once.
    A DataLoader takes batches from its workers in turn, so this rank's stream is the workers'
    batches interleaved in that order. ``position`` batches of that stream are already done
    (resume): each worker starts after its own done batches, and the workers are rotated so that
    the DataLoader's turn starts where the interrupted one would have continued. With
    ``equal_batches`` every rank stops after as many batches as the rank with the fewest (what
    DDP needs: the same number of steps on every rank).

    Returns ``{"total": batches of this rank in the epoch, "workers": [per worker process:
    (share index, share count, start batch, stop batch)]}``.
    """
    k, w = num_workers, world_size
    count = w * k

    def counts(r: int) -> List[int]:
        out = []
        for j in range(k):
            s = split.num_samples(seed, epoch, shuffle, r * k + j, count)
            out.append(s // batch_size if drop_last else -(-s // batch_size))
        return out

    mine = counts(rank)
    total = sum(mine)
    if equal_batches and w > 1:
        total = min(sum(counts(r)) for r in range(w))
    limit, _ = _round_robin(mine, total)
    if position > total:
        raise ValueError(f"position {position} is past the end of the epoch ({total} batches)")
    done, nxt = _round_robin(limit, position)
    rot = nxt if nxt >= 0 else 0
    workers = []
    for p in range(k):
        j = (rot + p) % k
        workers.append((rank * k + j, count, done[j], limit[j]))
    return {"total": total, "workers": workers}
