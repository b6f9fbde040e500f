"""PyTorch adapter: a prep split as an ``IterableDataset`` of batches.

    import prep.torch
    data = prep.torch.ShardDataset("shards/", "train", batch_size=512, seed=0)
    loader = prep.torch.DataLoader(data, num_workers=6, device="cuda")
    for epoch in range(epochs):
        data.set_epoch(epoch)
        for images, labels in loader:      # uint8 [N, C, H, W] and int64 [N] tensors, on the GPU
            ...

With ``device="cuda"`` the workers write each batch into page-locked shared memory and only a
slot number crosses the DataLoader's queue; the main process queues the slot's copy to the GPU
on the current stream (see :class:`DataLoader`). Without it the batches are CPU tensors, pinned
with ``pin_memory=True``.

The work is split by DataLoader worker and by data-parallel rank without duplicates: worker
``j`` of rank ``r`` reads share ``r * workers + j`` of ``world * workers`` of the epoch's blocks
(see ``prep.Split.batches``). Rank and world size come from the arguments, else from
``torch.distributed`` when it is initialised, else 0 and 1.

``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly: the batches after the last
one delivered, in the order an uninterrupted epoch would have delivered them. The count of
delivered batches is kept by the dataset itself when it runs in the main process
(``num_workers=0``) and by :class:`DataLoader` (a ``torch.utils.data.DataLoader`` that counts)
when workers produce the batches.

PyTorch is imported when this module is, not by ``import prep``.
"""

from __future__ import annotations

import mmap
import os
import select
import shutil
import tempfile
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.utils.data

import prep as _prep_pkg
from prep import worker_plan

__all__ = ["ShardDataset", "DataLoader"]

_STATE_VERSION = 1


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_list(text: str) -> set:
    """CPUs of a kernel CPU list such as "0-3,8,10-11"."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _current_cpu() -> int:
    """The CPU the calling thread last ran on."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, "processor"


def _worker_cpus(workers: int) -> Optional[List[int]]:
    """The CPUs for DataLoader workers that feed the GPU: those this process may use except the
    core the calling thread (the one that launches the training step) runs on, SMT siblings
    included. A small model's step is bound by that thread's kernel launches, so a worker
    thread beside it takes time from the whole loop (on a 16-core H100 host: 0.915 against
    0.859 of the data-on-GPU loop in one call, no difference in two others; BENCHMARKS.md).
    None (no restriction) where that would leave fewer CPUs than workers, or off Linux."""
    try:
        allowed = os.sched_getaffinity(0)
        cpu = _current_cpu()
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    keep = {cpu}
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            keep |= _cpu_list(f.read())
    except (OSError, ValueError):
        pass
    rest = sorted(allowed - keep)
    if len(allowed) < 4 or len(rest) < max(1, workers):
        return None
    return rest


def _to_tensor(a: np.ndarray) -> torch.Tensor:
    try:
        return torch.from_numpy(a)
    except TypeError:
        # uint16 on a PyTorch without torch.uint16: int32 holds every value.
        return torch.from_numpy(a.astype(np.int32))


class ShardDataset(torch.utils.data.IterableDataset):
    """Batches of one split of a prep dataset: ``(images, labels)`` tensors, images in the
    dataset's dtype (uint8, uint16, float16, float32) and shape ``[N, C, H, W]``, labels int64;
    for a dataset whose samples carry fields, dicts of tensors (``image``, ``class`` and each
    field with its batch axis: a mask ``[N, H, W]``, labels ``[N, K]`` uint8, values
    ``[N, K]`` float32), on every path (CPU, pinned, ``device=``).

    Use it with ``batch_size=None`` in a ``DataLoader`` (batches are made here, by Rust
    threads), or with :class:`DataLoader`, which sets that and counts batches for
    ``state_dict()``.

    Arguments: ``path`` (dataset directory) or an open ``prep.Dataset``; ``split``;
    ``batch_size``; ``shuffle``, ``seed`` (the order is ``prep train``'s for a seed and epoch);
    ``drop_last`` (per worker share: each share cuts its own last partial batch);
    ``rank``/``world_size`` (default: ``torch.distributed`` if initialised, else 0/1);
    ``equal_batches`` (every rank stops after as many batches as the rank with the fewest, which
    DDP needs; the few samples past that are left out of the epoch); ``pin_memory`` (return
    pinned tensors; in worker processes pinning is left to the DataLoader's ``pin_memory``,
    which :class:`DataLoader` sets); ``skip_damaged`` (leave damaged blocks out instead of
    raising ``prep.DamagedBlockError``); ``threads`` (Rust threads per process; default: all
    cores without workers, one in each DataLoader worker: the workers are the parallelism, as
    in any DataLoader, and more threads each only compete with the thread launching the GPU's
    work).
    """

    def __init__(self, path: Any, split: str = "train", batch_size: int = 512,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 equal_batches: bool = False, pin_memory: bool = False,
                 skip_damaged: bool = False, threads: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(path, _prep_pkg.Dataset):
            path = path.path
        self.path = os.fspath(path)
        self.split = split
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self._rank = rank
        self._world_size = world_size
        self.equal_batches = bool(equal_batches)
        self.pin_memory = bool(pin_memory)
        self.skip_damaged = bool(skip_damaged)
        self.threads = threads
        self.epoch = 0
        # Batches of this rank's epoch delivered so far, and the worker count they came from.
        self.position = 0
        self._position_workers: Optional[int] = None
        # Damaged blocks skipped in this process (workers keep their own).
        self.skipped = 0
        self._split_obj: Optional[_prep_pkg.Split] = None
        self._pid: Optional[int] = None
        # Set by DataLoader(device=...) while its workers run: where they put their batches.
        self._ring: Optional[_RingLayout] = None
        # Opened now so that a bad path or split fails here, not in a worker.
        self._open()

    # -- where this process stands ------------------------------------------------------------

    def _open(self) -> "_prep_pkg.Split":
        # Each process opens its own reader (a forked worker must not share the parent's).
        if self._split_obj is None or self._pid != os.getpid():
            self._split_obj = _prep_pkg.open(self.path)[self.split]
            self._pid = os.getpid()
        return self._split_obj

    def __getstate__(self) -> Dict[str, Any]:
        d = self.__dict__.copy()
        d["_split_obj"] = None
        d["_pid"] = None
        return d

    def rank_world(self) -> Tuple[int, int]:
        """(rank, world size): the arguments, else torch.distributed's, else (0, 1)."""
        rank, world = self._rank, self._world_size
        dist = torch.distributed
        if (rank is None or world is None) and dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world = dist.get_world_size() if world is None else world
        rank = 0 if rank is None else int(rank)
        world = 1 if world is None else int(world)
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} of world size {world}: need 0 <= rank < world size")
        return rank, world

    def _plan(self, num_workers: int) -> Dict[str, Any]:
        rank, world = self.rank_world()
        position = self.position
        if self._position_workers is not None and position and self._position_workers != num_workers:
            raise ValueError(
                f"the saved position ({position} batches) was taken with {self._position_workers} "
                f"DataLoader workers; resume with the same number of workers (this loader has {num_workers})")
        plan = worker_plan(self._open(), self.batch_size, shuffle=self.shuffle, seed=self.seed,
                           epoch=self.epoch, drop_last=self.drop_last, rank=rank,
                           world_size=world, num_workers=num_workers, equal_batches=self.equal_batches,
                           position=0)
        if position >= plan["total"]:
            position = 0  # the epoch was finished: a new pass starts it again
        if position:
            plan = worker_plan(self._open(), self.batch_size, shuffle=self.shuffle,
                               seed=self.seed, epoch=self.epoch, drop_last=self.drop_last,
                               rank=rank, world_size=world, num_workers=num_workers,
                               equal_batches=self.equal_batches, position=position)
        plan["position"] = position
        return plan

    def __len__(self) -> int:
        """Batches this rank yields in an epoch (all DataLoader workers together)."""
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else (self._position_workers or 1)
        return self._plan(workers)["total"]

    # -- epochs and resume ---------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (a new epoch starts at its first batch; the epoch of a
        loaded state keeps its position)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.position = 0

    def state_dict(self) -> Dict[str, Any]:
        rank, world = self.rank_world()
        return {
            "version": _STATE_VERSION,
            "path": self.path,
            "split": self.split,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "equal_batches": self.equal_batches,
            "rank": rank,
            "world_size": world,
            "epoch": self.epoch,
            "position": self.position,
            "num_workers": self._position_workers,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unknown state version {state.get('version')!r}")
        rank, world = self.rank_world()
        for key, mine in (("batch_size", self.batch_size), ("shuffle", self.shuffle),
                          ("seed", self.seed), ("drop_last", self.drop_last),
                          ("equal_batches", self.equal_batches), ("world_size", world),
                          ("rank", rank)):
            if state[key] != mine:
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this dataset has {mine!r}: "
                    "the order would differ")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._position_workers = state["num_workers"]

    def _delivered(self, num_workers: int) -> None:
        """One more batch reached the consumer (called in the main process)."""
        self._position_workers = num_workers
        self.position += 1

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        worker = info.id if info is not None else 0
        plan = self._plan(workers)
        share, count, start, stop = plan["workers"][worker]
        if info is None:
            self.position = plan["position"]
        cpus = self._ring.worker_cpus if self._ring is not None and info is not None else None
        if cpus:
            # Before the reader's threads start: they inherit it.
            os.sched_setaffinity(0, cpus)
        split = self._open()
        threads = self.threads or (1 if info is not None else _cpu_count())
        pin = self.pin_memory and info is None and torch.cuda.is_available()
        if self.pin_memory and info is None and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but CUDA is not available: tensors are not pinned",
                          stacklevel=2)
        if start >= stop:
            return
        it = split.batches(self.batch_size, shuffle=self.shuffle, seed=self.seed,
                           epoch=self.epoch, rank=share, world_size=count,
                           drop_last=self.drop_last, threads=threads, start=start,
                           skip_damaged=self.skip_damaged)
        it._raw_meta = True
        if self._ring is not None and info is not None:
            yield from self._into_ring(it, stop - start, info.id)
            return

        names = _batch_names(split)
        meta = _meta_parts(split)

        def tensors():
            for _ in range(stop - start):
                try:
                    parts = _parts(next(it), names)
                except StopIteration:
                    return
                yield [_meta_list(a) if m else _to_tensor(a) for a, m in zip(parts, meta)]

        # Pinning copies each batch into page-locked memory, about a millisecond for 1.5 MiB: in
        # the training thread that is time taken from launching kernels, so a thread of its own
        # pins the next batches while this one hands them out.
        batches = _Pinned(tensors()) if pin else tensors()
        try:
            for parts in batches:
                if info is None:
                    self._delivered(1)
                self.skipped = it.skipped
                yield _batch(parts, names)
        finally:
            if pin:
                batches.close()
            self.skipped = it.skipped
            it.close()

    def _into_ring(self, it: Any, count: int, worker: int) -> Iterator[Tuple[str, int]]:
        """In a DataLoader worker, at the first batch the DataLoader asks for: this worker's
        whole share, batch after batch into its slots of the ring, each announced by one byte
        on the worker's pipe (the main process reads the ring, not the DataLoader's queue);
        then a single item for the DataLoader, which ends the worker."""
        ring = _RingMap(self._ring)
        names = _batch_names(self._open())
        try:
            with open(self._ring.pipe(worker), "wb", buffering=0) as pipe:
                try:
                    for k in range(count):
                        if ring.closed():
                            break
                        try:
                            parts = _parts(next(it), names)
                        except StopIteration:
                            break
                        slot = k % ring.layout.slots
                        if not ring.wait_free(worker, slot):
                            break
                        n = len(parts[0])
                        for j, a in enumerate(parts):
                            np.copyto(ring.part(worker, slot, j)[:n], a)
                        ring.fill(worker, slot, n)
                        # The pipe, not the state word, tells the main process: the write and
                        # its read order the slot's bytes before them on any CPU.
                        pipe.write(b"B")
                        self.skipped = it.skipped
                    pipe.write(b"E")
                except BaseException:
                    pipe.write(b"X")  # the exception itself goes through the DataLoader
                    raise
        finally:
            self.skipped = it.skipped
            it.close()
            ring.close()
        yield (_RING_TAG, worker)


_RING_TAG = "prep-ring"
# A worker waiting for a free slot naps 0.1 ms, then twice as long each time, up to 2 ms: a slot
# of a ring several batches deep is refilled long before the loop reaches it.
_FIRST_NAP = 0.0001
_MAX_NAP = 0.002
# The ring's size where batches are small: up to 256 MiB, at most 16 batches a worker.
_RING_BYTES = 256 << 20
_RING_MAX_SLOTS = 16


def _align(n: int, to: int = 4096) -> int:
    return -(-n // to) * to


class _RingLayout:
    """Where the batches of DataLoader workers go: a folder in shared memory (/dev/shm) with a
    file `ring` (a header of one state word (0 free, 1 filled) and one sample count per slot and
    a closed flag; then `slots` slots per worker, each holding one batch's parts: images, labels
    and each field, a whole batch of each, page-aligned) and one pipe (FIFO) per worker.
    Picklable: workers open them by path."""

    def __init__(self, folder: str, workers: int, slots: int, batch: int,
                 parts: List[Tuple[Tuple[int, ...], np.dtype]], meta: List[bool]) -> None:
        self.folder, self.workers, self.slots, self.batch = folder, workers, slots, batch
        # Which parts are metadata: read from the ring as dicts, not copied to the GPU.
        self.meta = meta
        self.path = os.path.join(folder, "ring")
        # (sample shape, dtype, bytes a sample, offset in the slot) of each part.
        self.parts = []
        at = 0
        for shape, dtype in parts:
            dtype = np.dtype(dtype)
            per = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self.parts.append((tuple(shape), dtype, per, at))
            at += _align(batch * per)
        self.slot_bytes = at
        self.header = _align((2 * workers * slots + 1) * 4)
        self.total = self.header + workers * slots * self.slot_bytes
        # Where the workers may run (None: anywhere); see _worker_cpus.
        self.worker_cpus: Optional[List[int]] = None

    def pipe(self, worker: int) -> str:
        return os.path.join(self.folder, f"w{worker}")

    def offset(self, worker: int, slot: int) -> int:
        return self.header + (worker * self.slots + slot) * self.slot_bytes


class _RingMap:
    """A process's mapping of a ring."""

    def __init__(self, layout: _RingLayout) -> None:
        self.layout = layout
        with open(layout.path, "r+b") as f:
            self.mm = mmap.mmap(f.fileno(), layout.total)
        n = layout.workers * layout.slots
        words = np.frombuffer(self.mm, dtype=np.int32, count=2 * n + 1)
        self.state, self.count, self.flag = words[:n], words[n:2 * n], words[2 * n:]
        self.parent = os.getppid()

    def part(self, worker: int, slot: int, j: int) -> np.ndarray:
        L = self.layout
        shape, dtype, per, at = L.parts[j]
        return np.frombuffer(self.mm, dtype=dtype, count=L.batch * per // dtype.itemsize,
                             offset=L.offset(worker, slot) + at).reshape((L.batch,) + shape)

    def wait_free(self, worker: int, slot: int) -> bool:
        """Wait until the main process's GPU has copied the slot out; False if the ring was
        closed (the loop stopped early, or failed) or the main process is gone."""
        i = worker * self.layout.slots + slot
        nap, napped = _FIRST_NAP, 0.0
        while self.state[i] != 0:
            if self.closed():
                return False
            if napped > 1.0:
                if os.getppid() != self.parent:
                    return False
                napped = 0.0
            time.sleep(nap)
            napped += nap
            # A full ring is the usual state (the workers are ahead): the naps lengthen so that
            # waiting workers do not wake thousands of times a second beside the training loop.
            nap = min(2 * nap, _MAX_NAP)
        return True

    def fill(self, worker: int, slot: int, n: int) -> None:
        i = worker * self.layout.slots + slot
        self.count[i] = n
        self.state[i] = 1

    def closed(self) -> bool:
        return bool(self.flag[0])

    def close_ring(self) -> None:
        self.flag[0] = 1

    def close(self) -> None:
        self.state = self.count = self.flag = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a view is still alive; the mapping goes with it
            pass


class _ToDevice:
    """The main process's side of the ring. The whole ring is page-locked (cudaHostRegister),
    so copies from it are asynchronous. Each handed-over slot (images, then labels) is copied to
    `device` in one copy on the current stream, and behind that copy, in stream order, the GPU
    writes the slot's state word back to 0 (a 4-byte copy into the same page-locked memory): the
    slot is freed when its copy has completed, without this process waiting for it or a thread
    of its own polling, and a worker never refills a slot that is still being read."""

    def __init__(self, layout: _RingLayout, device: torch.device) -> None:
        self.layout = layout
        self.ring = _RingMap(layout)
        self.device = device
        self._base = torch.from_numpy(np.frombuffer(self.ring.mm, dtype=np.uint8))
        rc = torch.cuda.cudart().cudaHostRegister(self._base.data_ptr(), layout.total, 0)
        if int(rc) != 0:
            self._base = None  # type: ignore[assignment]
            self.ring.close()
            raise RuntimeError(f"cudaHostRegister of the batch ring {layout.path} failed: {rc}")
        self._state = torch.from_numpy(self.ring.state)
        self._zero = torch.zeros(1, dtype=torch.int32, device=device)
        self._dtypes = [_torch_dtype(dtype) for _, dtype, _, _ in layout.parts]
        # Views made once: each batch costs the launching thread as few calls as can be.
        n = layout.workers * layout.slots
        self._slots = [self._base[layout.offset(i // layout.slots, i % layout.slots):][
            :layout.slot_bytes] for i in range(n)]
        self._states = [self._state[i:i + 1] for i in range(n)]

    def __call__(self, w: int, s: int) -> List[torch.Tensor]:
        """The parts of slot `s` of worker `w` on the device, copied in one copy."""
        L = self.layout
        i = w * L.slots + s
        n = int(self.ring.count[i])
        slot = self._slots[i]
        _, _, per, at = L.parts[-1]
        if n != L.batch:
            slot = slot[:at + per * n]
        # Metadata is read here, before the slot can be handed back to its worker.
        meta = {j: _meta_list(self.ring.part(w, s, j)[:n]) for j, m in enumerate(L.meta) if m}
        buf = slot.to(self.device, non_blocking=True)
        self._states[i].copy_(self._zero, non_blocking=True)
        out: List[Any] = []
        for j, ((shape, _, per, at), dt) in enumerate(zip(L.parts, self._dtypes)):
            if j in meta:
                out.append(meta[j])
                continue
            t = buf[at:at + n * per].view(dt).view((n,) + shape)
            if dt is torch.int16:  # uint16 on a PyTorch without torch.uint16
                t = t.to(torch.int32) & 0xFFFF
            out.append(t)
        return out

    def close(self) -> None:
        # The last copies (and their state writes) must be done before the memory goes.
        torch.cuda.synchronize(self.device)
        if self._base is not None:
            torch.cuda.cudart().cudaHostUnregister(self._base.data_ptr())
            self._base = self._state = None  # type: ignore[assignment]
            self._slots = self._states = []
        self.ring.close()


def _meta_parts(split: "_prep_pkg.Split") -> List[bool]:
    """Which parts of a batch (image, class, fields) are metadata."""
    return [False, False] + list(split._meta)


def _meta_list(a: Any) -> List[Dict[str, Any]]:
    return _prep_pkg._meta_list(np.asarray(a))


def _to(t: Any, device: torch.device) -> Any:
    return t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t


def _batch_names(split: "_prep_pkg.Split") -> Optional[List[str]]:
    """The keys of a batch dict (``image``, ``class``, then each field), or None for a dataset
    without fields, whose batches stay ``(images, labels)`` tuples."""
    names = split._field_names
    return ["image", "class"] + list(names) if names else None


def _parts(batch: Any, names: Optional[List[str]]) -> List[np.ndarray]:
    """A batch of ``Split.batches`` as a list of arrays in the order of `names`."""
    return [batch[k] for k in names] if names else list(batch)


def _batch(parts: List[torch.Tensor], names: Optional[List[str]]) -> Any:
    return dict(zip(names, parts)) if names else tuple(parts)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    if dtype == np.uint16:
        return getattr(torch, "uint16", torch.int16)
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class _Pinned:
    """Pinned copies of the tensors of `source` (a list a batch), made by a thread a few batches
    ahead.
    An exception of the source or of pinning is raised where the batch would have been."""

    _END = object()

    def __init__(self, source: Iterator[List[torch.Tensor]], ahead: int = 3) -> None:
        import queue
        import threading

        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._source = source
        self._t = threading.Thread(target=self._run, name="prep-pin", daemon=True)
        self._t.start()

    def _put(self, item: Any) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    @staticmethod
    def _pin(t: torch.Tensor) -> torch.Tensor:
        # Tensor.pin_memory() copies with PyTorch's intra-op threads, which then spin beside the
        # training thread (without them the loop ran 0.90 of data-on-GPU speed instead of 0.59,
        # BENCHMARKS.md); NumPy copies on this thread, without the GIL.
        p = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        try:
            np.copyto(p.numpy(), t.numpy())
        except (TypeError, RuntimeError):  # a dtype NumPy lacks
            p.copy_(t)
        return p

    def _run(self) -> None:
        try:
            for parts in self._source:
                pinned = [self._pin(t) if isinstance(t, torch.Tensor) else t for t in parts]
                if not self._put(pinned):
                    return
            self._put(self._END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._put(e)

    def __iter__(self) -> "_Pinned":
        return self

    def __next__(self) -> List[torch.Tensor]:
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._t.join()


def _read_byte(fd: int, it: Any, worker: int) -> bytes:
    """The next byte a worker wrote on its pipe, waiting without the GIL; a worker that died
    (killed, out of memory) is reported instead of waited for."""
    while True:
        try:
            b = os.read(fd, 1)
            if b:
                return b
        except BlockingIOError:
            pass
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            procs = getattr(it, "_workers", None)
            if procs is not None and not procs[worker].is_alive():
                raise RuntimeError(f"DataLoader worker {worker} (pid {procs[worker].pid}) of "
                                   f"prep.torch exited unexpectedly (exit code {procs[worker].exitcode})")


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` over a :class:`ShardDataset` that counts the batches it
    delivers, so that ``dataset.state_dict()`` (also ``loader.state_dict()``) is exact with
    worker processes too. ``batch_size`` is the dataset's (batches are made by it);
    ``pin_memory`` defaults to the dataset's. Persistent workers are refused: they would keep an
    old epoch and position.

    ``device`` (e.g. ``"cuda"``): deliver the batches as tensors on that GPU, ready for the
    current stream. With workers, each writes its batches into its slots of a ring in shared
    memory (a file in /dev/shm of ``prefetch_factor + 1`` batches a worker, or up to 16 while
    the ring stays under 256 MiB, page-locked
    by cudaHostRegister in this process) and announces each with one byte on a pipe of its own;
    this process takes the batches from the workers in the DataLoader's turn order, queues each
    slot's copy to the GPU on the current stream, and the GPU itself marks the slot free once
    the copy has completed. No batch is pickled, mapped afresh or copied in this process, and
    the DataLoader's queues carry nothing per batch: all of that otherwise takes time from the
    thread that launches the training step. Without workers the dataset's pinned batches are copied on the current
    stream. ``reserve_core`` (with ``device`` and workers): the workers and their threads run
    on every CPU of this process but the core of the thread that iterates the loader (SMT
    siblings included), so that the thread launching the GPU's work has a core of its own.
    """

    def __init__(self, dataset: ShardDataset, num_workers: int = 0,
                 pin_memory: Optional[bool] = None, device: Any = None,
                 reserve_core: bool = True, **kwargs: Any) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError("prep.torch.DataLoader takes a prep.torch.ShardDataset")
        if kwargs.get("persistent_workers"):
            raise ValueError("persistent_workers would keep the epoch and position the workers "
                             "started with; prep.torch.DataLoader starts them each epoch")
        for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn"):
            if kwargs.get(k) is not None:
                raise ValueError(f"{k} is the dataset's business: set it on ShardDataset")
        self.device = None if device is None else torch.device(device)
        self.reserve_core = bool(reserve_core)
        if self.device is not None:
            if self.device.type != "cuda":
                raise ValueError(f"device must be a CUDA device, got {device!r}")
            if not torch.cuda.is_available():
                raise RuntimeError("device=%r but CUDA is not available" % (device,))
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            if pin_memory:
                raise ValueError("pin_memory is for CPU batches; with device= they arrive on the GPU")
            pin_memory = False
        if pin_memory is None:
            # Without workers the dataset pins its own batches.
            pin_memory = dataset.pin_memory and num_workers > 0 and torch.cuda.is_available()
        super().__init__(dataset, batch_size=None, num_workers=num_workers,
                         pin_memory=pin_memory, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        ds: ShardDataset = self.dataset  # type: ignore[assignment]
        workers = self.num_workers
        if self.device is not None:
            yield from self._on_device(ds, workers)
            return
        if workers == 0:
            # The dataset runs here and counts for itself.
            yield from super().__iter__()
            return
        plan = ds._plan(workers)
        ds.position = plan["position"]
        for batch in super().__iter__():
            ds._delivered(workers)
            yield batch

    def _on_device(self, ds: ShardDataset, workers: int) -> Iterator[Any]:
        if workers == 0:
            # The dataset's pinning thread, then copies on the current stream: a stream of our
            # own would add its events and waits to every step of the launching thread.
            pin = ds.pin_memory
            ds.pin_memory = True
            try:
                for b in super().__iter__():
                    if isinstance(b, dict):
                        yield {k: _to(t, self.device) for k, t in b.items()}
                    else:
                        yield tuple(_to(t, self.device) for t in b)
            finally:
                ds.pin_memory = pin
            return
        plan = ds._plan(workers)
        ds.position = plan["position"]
        split = ds._open()
        folder = tempfile.mkdtemp(prefix="prep-ring-",
                                  dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        names = _batch_names(split)
        parts = [(split.shape, split.dtype), ((), np.int64)] + [
            (tuple(f["shape"]), np.dtype(_prep_pkg._DTYPES[f["dtype"]])) for f in split.dataset.fields]
        layout = _RingLayout(folder, workers, 1, ds.batch_size, parts, _meta_parts(split))
        # Deep enough to ride out a worker's hiccup (a garbage collection, a slow block) where
        # batches are small, at most `prefetch_factor + 1` a worker where they are large.
        slots = max((self.prefetch_factor or 2) + 1,
                    min(_RING_MAX_SLOTS, _RING_BYTES // (workers * layout.slot_bytes)))
        layout = _RingLayout(folder, workers, slots, ds.batch_size, parts, _meta_parts(split))
        if self.reserve_core:
            layout.worker_cpus = _worker_cpus(workers)
        to_device = it = None
        pipes: list = []
        try:
            with open(layout.path, "wb") as f:
                try:
                    # Reserved now: a tmpfs that runs out later kills the writer with SIGBUS.
                    os.posix_fallocate(f.fileno(), 0, layout.total)
                except OSError as e:
                    raise RuntimeError(
                        f"cannot reserve {layout.total / 2**20:.0f} MiB for the batch ring "
                        f"{layout.path}: {e.strerror}; use fewer workers, a smaller "
                        "prefetch_factor or batch, or device=None (pinned CPU batches)") from e
            for w in range(workers):
                os.mkfifo(layout.pipe(w), 0o600)
                # Read and write: opening does not wait for the worker, and no end of file
                # comes when it closes its end.
                pipes.append(os.open(layout.pipe(w), os.O_RDWR | os.O_NONBLOCK))
            to_device = _ToDevice(layout, self.device)
            ds._ring = layout
            try:
                it = super().__iter__()  # starts the workers, which take the ring with them
            finally:
                ds._ring = None
            # The DataLoader's order: the workers take turns, one batch each, a worker leaving
            # the turn when its share ends.
            seq = [0] * workers
            live = list(range(workers))
            failed = False
            while live and not failed:
                for w in list(live):
                    what = _read_byte(pipes[w], it, w)
                    if what == b"E":
                        live.remove(w)
                        continue
                    if what != b"B":
                        failed = True
                        break
                    ds._delivered(workers)
                    yield _batch(to_device(w, seq[w] % slots), names)
                    seq[w] += 1
            if failed:
                to_device.ring.close_ring()
            for _ in it:  # the workers' last items; a worker's exception is raised here
                pass
            if failed:
                raise RuntimeError("a DataLoader worker of prep.torch failed")
        finally:
            if to_device is not None:
                to_device.ring.close_ring()  # workers waiting for a slot stop
                to_device.close()
            del it  # the DataLoader's iterator: stops and joins its workers
            for fd in pipes:
                os.close(fd)
            shutil.rmtree(folder, ignore_errors=True)

    def __len__(self) -> int:
        ds: ShardDataset = self.dataset  # type: ignore[assignment]
        return ds._plan(max(1, self.num_workers))["total"]

    def state_dict(self) -> Dict[str, Any]:
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
