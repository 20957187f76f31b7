"""Same-host pushes without a collective: the receiver reads the publisher's packed buckets.

- shm: the buckets live in one file under /dev/shm (tmpfs: memory, not disk), mapped by the
  publisher, which packs into it, and by each receiver, which copies out of it. The file is
  reserved with posix_fallocate, so a full /dev/shm fails here with a message instead of a SIGBUS
  on first touch.
- cuda-ipc: the buckets stay in the trainer's GPU memory; each receiver on the same GPU maps them
  with CUDA IPC handles (torch's `_share_cuda_` / `_new_shared_cuda`, the mechanism behind
  torch.multiprocessing) and copies device to device. The handles travel as JSON through the
  store: no pickles. torch's IPC reference counting keeps a mapped buffer alive in the trainer
  until the receiver has let go of it.

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

from . import buckets as bk
from .protocol import WeightSyncError

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
    """CUDA IPC handles of the publisher's bucket buffers (each a whole storage of its own), for
    one receiver: each share carries a reference count that its receiver drops when it lets go."""
    docs = []
    for buf in buffers:
        _dev, handle, size, offset, ref, ref_offset, event, event_sync = buf.untyped_storage()._share_cuda_()
        docs.append({"handle": _b64(handle), "size": size, "offset": offset, "ref": _b64(ref),
                     "ref_offset": ref_offset, "event": _b64(event), "event_sync": bool(event_sync),
                     "nbytes": buf.nbytes})
    return docs


def copy_cuda(docs: Sequence[dict], device: torch.device, out: Sequence[torch.Tensor]) -> None:
    """Map the publisher's buffers on `device` (our index of the same GPU) and copy them into `out`."""
    torch.cuda._lazy_init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    for d, buf in zip(docs, out):
        storage = torch.UntypedStorage._new_shared_cuda(
            index, _bytes(d["handle"]), d["size"], d["offset"], _bytes(d["ref"]), d["ref_offset"],
            _bytes(d["event"]), d["event_sync"])
        src = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (d["nbytes"],), (1,))
        bk.wire(buf).copy_(src)
        del src, storage  # let go of the mapping: the trainer may free or reuse its buffer
    torch.cuda.current_stream(device).synchronize()
