"""Same-host pushes without a collective: the receiver reads the publisher's packed buckets.

- shm: the buckets live in one file under /dev/shm (tmpfs: memory, not disk), mapped by the
  publisher, which packs into it, and by each receiver, which copies out of it. The file is
  reserved with posix_fallocate, so a full /dev/shm fails here with a message instead of a SIGBUS
  on first touch.
- cuda-ipc: the buckets stay in the trainer's GPU memory, in buffers kept from push to push while
  the layout holds; each receiver on the same GPU maps them with CUDA IPC through torch's
  supported API (torch.multiprocessing.reductions: `reduce_tensor` in the trainer,
  `rebuild_cuda_tensor` in the receiver) once, and every later push is a device-to-device copy
  out of the same mapping (opening an IPC handle costs milliseconds; a copy of 80 MiB well under
  one). The handles travel as JSON through the store: no pickles. Each receiver gets one share of
  the buffers (torch counts references per share and keeps a mapped buffer alive in the trainer
  until its receiver has let go of it).

A receiver copies into its own buffers and only then checks that the push was not cancelled:
the publisher repacks its buffers only after a push has been acknowledged or cancelled, so a copy
taken before that check is whole.
"""
from __future__ import annotations

import base64
import mmap
import os
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch

from grpojob.sync import buckets as bk
from grpojob.sync.protocol import WeightSyncError

ALIGN = 64  # bytes: each bucket starts on a cache line


class ShmFull(RuntimeError):
    """/dev/shm has no room for the buckets: a setup problem, not a failed push."""


def _offsets(layout: bk.Layout) -> tuple[list[int], int]:
    offsets, at = [], 0
    for b in layout.buckets:
        offsets.append(at)
        at += -(-b.nbytes // ALIGN) * ALIGN
    return offsets, max(at, 1)


class ShmSegment:
    """The publisher's side: every bucket of `layout` in one /dev/shm file, as typed flat buffers."""

    def __init__(self, path: Path, layout: bk.Layout):
        self.path = path
        self.offsets, self.size = _offsets(layout)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except OSError as e:
                path.unlink(missing_ok=True)
                raise ShmFull(
                    f"weightSync.backend shm: no room for {self.size / 2**20:.0f} MiB in {path.parent} "
                    f"({os.strerror(e.errno) if e.errno else e}); give it more room or use backend gloo") from e
            mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        raw = torch.frombuffer(mm, dtype=torch.uint8)
        self.buffers = [raw[o:o + b.nbytes].view(bk.torch_dtype(b.dtype))
                        for o, b in zip(self.offsets, layout.buckets)]

    def doc(self) -> dict:
        return {"path": str(self.path), "offsets": self.offsets, "size": self.size}

    def close(self) -> None:
        """Unlink the file; the mapping goes with the last buffer (a receiver may still hold its own)."""
        self.path.unlink(missing_ok=True)
        self.buffers = []


class ShmReader:
    """The receiver's side: maps a segment read-only, once per file (pushes of one layout reuse it)."""

    def __init__(self):
        self._path: Optional[str] = None
        self._raw: Optional[torch.Tensor] = None

    def buffers(self, doc: dict, layout: bk.Layout) -> list[torch.Tensor]:
        """The segment's buckets as typed flat views of the (read-only) mapping."""
        if doc["path"] != self._path:
            self._raw, self._path = self._map(doc), doc["path"]
        return [self._raw[o:o + b.nbytes].view(bk.torch_dtype(b.dtype)) for o, b in zip(doc["offsets"], layout.buckets)]

    def copy(self, doc: dict, layout: bk.Layout, out: Sequence[torch.Tensor]) -> None:
        if doc["path"] != self._path:
            self._raw, self._path = self._map(doc), doc["path"]
        raw = self._raw
        # One intra-op thread: a copy here would give the receiving thread an OpenMP team of its
        # own, and the engine's decode steps slow down for as long as the process lives (hf_engine).
        with bk.host_copies(out):
            for o, b, buf in zip(doc["offsets"], layout.buckets, out):
                bk.wire(buf).copy_(raw[o:o + b.nbytes])

    @staticmethod
    def _map(doc: dict) -> torch.Tensor:
        try:
            fd = os.open(doc["path"], os.O_RDONLY)
        except OSError as e:
            raise WeightSyncError(f"cannot open the trainer's shared memory {doc['path']}: {e.strerror}") from e
        try:
            mm = mmap.mmap(fd, doc["size"], prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        with warnings.catch_warnings():  # read-only on purpose: the receiver never writes
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            return torch.frombuffer(mm, dtype=torch.uint8)


def _b64(data: Optional[bytes]) -> Optional[str]:
    return base64.b64encode(data).decode() if data else None


def _bytes(text: Optional[str]) -> bytes:
    return base64.b64decode(text) if text else b""


def share_cuda(buffers: Sequence[torch.Tensor]) -> list[dict]:
    """One receiver's share of the publisher's bucket buffers: the arguments of torch's
    `rebuild_cuda_tensor` as JSON (each share carries a reference count that its receiver drops
    when it lets go of the mapping)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    docs = []
    for buf in buffers:
        rebuild, args = reduce_tensor(buf)
        if rebuild is not rebuild_cuda_tensor:
            raise WeightSyncError(f"cuda-ipc shares CUDA tensors only, not one on {buf.device}")
        (_, size, stride, offset, _, dtype, _, handle, storage_bytes, storage_offset, _, ref, ref_offset, event,
         event_sync) = args
        docs.append({"size": list(size), "stride": list(stride), "offset": offset,
                     "dtype": str(dtype).removeprefix("torch."), "handle": _b64(handle),
                     "storage_bytes": storage_bytes, "storage_offset": storage_offset, "ref": _b64(ref),
                     "ref_offset": ref_offset, "event": _b64(event), "event_sync": bool(event_sync)})
    return docs


def _rebuild(doc: dict, device: torch.device) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    index = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild_cuda_tensor(torch.Tensor, tuple(doc["size"]), tuple(doc["stride"]), doc["offset"],
                               torch.UntypedStorage, getattr(torch, doc["dtype"]), index, _bytes(doc["handle"]),
                               doc["storage_bytes"], doc["storage_offset"], False, _bytes(doc["ref"]),
                               doc["ref_offset"], _bytes(doc["event"]) or None, doc["event_sync"])


class CudaReader:
    """The receiver's side: maps a share of the publisher's buffers once and copies out of the
    mapping at every push of it; a new share (new buffers, a new layout) replaces the mapping."""

    def __init__(self):
        self._mapped: list[torch.Tensor] = []
        self._handles: list[tuple[str, int]] = []

    def mapped(self, docs: Sequence[dict], device: torch.device) -> list[torch.Tensor]:
        """The publisher's buffers, mapped on first use of this share."""
        handles = [(d["handle"], d["storage_offset"]) for d in docs]
        if handles != self._handles:
            self._mapped, self._handles = [], []  # let go of the old buffers before mapping the new
            torch.cuda._lazy_init()
            self._mapped = [_rebuild(d, device) for d in docs]
            self._handles = handles
        return self._mapped

    def copy(self, docs: Sequence[dict], device: torch.device, out: Sequence[torch.Tensor]) -> None:
        for src, buf in zip(self.mapped(docs, device), out):
            bk.wire(buf).copy_(bk.wire(src))
        torch.cuda.current_stream(device).synchronize()
