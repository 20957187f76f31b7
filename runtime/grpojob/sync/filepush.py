"""The checkpoint backend's side of a push (trainer rank 0): which files a version is written as.

Without delta pushes (weightSync.delta false, a LoRA push, or no server whose engine declares
`delta_files`) a version is written whole, straight from the weight stream (`files.save`), as it
always was. Otherwise it is first packed into the retained buckets of one medium (the trainer's
device, as the other paths keep them), compared with the previous version there (`delta`), and:
- the servers whose engines hold that previous version (a push of ours put it there) and
  declared `delta_files` get a delta directory (`files.save_delta`), a few KiB where the step
  changed few values;
- the others, and servers that come later or restarted, get the version whole, written once from
  the retained buckets when the first of them needs it.
After a push that found no bucket worth a delta (most values changed), the next REST versions are
written straight from the stream, as without delta pushes: keeping the base costs a copy of the
weights per push (1.15-1.2x a whole write on 2 CPU cores). The one after is kept again, and the
next tries a delta.
"""
from __future__ import annotations

from typing import Optional

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync import files
from grpojob.sync.membership import Member
from grpojob.sync.protocol import WeightSyncError
from grpojob.sync.retained import Retained
from grpojob.sync.stream import TensorStream

REST = 7


def packs(delta: bool, r: Retained, targets: list[Member]) -> bool:
    """Whether this version goes through the retained buckets (else it is written from the stream)."""
    return delta and r.adapter is None and any(m.reg.delta_files for m in targets)


def whole(root: str, r: Retained, stream: Optional[TensorStream]) -> str:
    """The version's whole directory (relative to `root`), written on first need: from `stream`
    when it was not packed, else from the retained buckets."""
    if r.path is None:
        if stream is not None and not stream.exhausted:
            r.path = files.save(root, r.version, stream)
        elif r.filled:
            bufs = r.media[next(iter(r.filled))]
            views = [nt for b, buf in zip(r.layout.buckets, bufs) for nt in bk.unpack(b, buf)]
            r.path = files.save(root, r.version, TensorStream.of(views))
        else:
            raise WeightSyncError(f"weights version {r.version} are neither written nor retained")
    return r.path


def delta(root: str, r: Retained, packer: dl.DeltaPacker) -> tuple[str, int]:
    """The version as a delta directory against `r.base` (from the packer's comparison); returns its
    path relative to `root` and its bytes of tensor data."""
    arena = next(iter(packer.arenas.values()))
    changes = dl.by_tensor(r.layout, dl.recorded(packer.counts, arena))
    bufs = r.media[packer.base]
    views = {n: t for i, b in enumerate(r.layout.buckets) if packer.counts[i] is None
             for n, t in bk.unpack(b, bufs[i])}
    return files.save_delta(root, r.version, r.base.weights, changes, views.__getitem__)
