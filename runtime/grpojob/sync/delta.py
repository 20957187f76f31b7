"""Delta pushes: only the values that changed since the last push travel, bit for bit.

At the learning rates of real models almost every serving-dtype (bf16) weight is bitwise the
same from one step to the next, so a push can send, per bucket, the flat positions and the new
values of what changed instead of the whole bucket. The same functions serve every path:

- The trainer (`DeltaPacker`) packs each bucket into a scratch buffer on the device of a medium
  that still holds the previous push (the base), compares the two as raw integer bits (so -0.0
  against +0.0 and every NaN payload count as what they are) and decides per bucket: a delta
  when at most 1/CAP_DIVISOR of its values changed, else the dense bucket. The media are then
  brought to the new version in place (a scatter where they held the base, a copy where not), so
  they stay the base of the next push and the dense source of a server that joins late.
- The positions and values go into the arena: per bucket an index buffer and a value buffer of
  fixed capacity (numel / CAP_DIVISOR), in the media the paths read (host, device, /dev/shm), so
  a handoff shares it once per layout like the buckets themselves.
- `messages` lists what a collective path broadcasts (dense buckets, the used part of the arena);
  `copy_handoff` is what a same-host receiver copies out of the trainer's buckets and arena.
- The receiver applies a delta only to the buffers that hold the command's base version (its
  weights id): anything else (a server that restarted, joined late or missed a version) is
  refused and is brought back with a dense push (the publisher only sends a delta to servers its
  table says hold the base; the receiver's check makes a wrong base impossible, not just unlikely).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from grpojob.sync import buckets as bk

CAP_DIVISOR = 8  # a delta of bf16 sends 6 bytes (int32 position, value) per change: <= 3/8 of dense
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Counts = Optional[list[Optional[int]]]  # per bucket: changed values sent, or None for the dense bucket


def capacity(bucket: bk.Bucket) -> int:
    return bucket.numel // CAP_DIVISOR


def index_dtype(bucket: bk.Bucket) -> torch.dtype:
    return torch.int32 if bucket.numel < 2**31 else torch.int64


def arena_layout(layout: bk.Layout) -> bk.Layout:
    """Two flat buffers per bucket: positions (int32, or int64 past 2**31 values) and values."""
    out = []
    for b in layout.buckets:
        out += [bk.Bucket(bk.dtype_name(index_dtype(b)), capacity(b), ()), bk.Bucket(b.dtype, capacity(b), ())]
    return bk.Layout(tuple(out))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a flat buffer as integers of the same width (bitwise comparison)."""
    return t.view(_BITS[t.element_size()])


def changed(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Flat positions (int64) where the bits of `new` differ from `old`."""
    return torch.nonzero(bits(new) != bits(old)).squeeze(1)


class DeltaPacker(bk.Packer):
    """Packs a push as deltas against `base` (the medium that holds the previous push); `based`:
    the media holding it (scattered into), the others get the new buckets whole. `arenas`: the
    media of the arena. `counts` once done: what `messages` and receivers need."""

    def __init__(self, layout: bk.Layout, stream, media: dict[str, Sequence[torch.Tensor]], *, base: str,
                 based: set[str], arenas: dict[str, Sequence[torch.Tensor]], on_done=None):
        super().__init__(layout, stream, media, on_done=on_done)
        self.base, self.based, self.arenas = base, based, arenas
        self.counts: list[Optional[int]] = [None] * len(layout.buckets)
        self.changed_values = 0  # over every bucket (a dense bucket's changes are counted too)
        self._scratch: dict[str, torch.Tensor] = {}

    def _new(self, bucket: bk.Bucket, like: torch.Tensor) -> torch.Tensor:
        scratch = self._scratch.get(bucket.dtype)
        if scratch is None or scratch.numel() < bucket.numel:  # one per dtype, the size of its largest bucket
            scratch = self._scratch[bucket.dtype] = torch.empty(
                max(b.numel for b in self.layout.buckets if b.dtype == bucket.dtype), dtype=like.dtype,
                device=like.device)
        return scratch[:bucket.numel]

    def pack_bucket(self, i: int, bucket: bk.Bucket, tensors: dict[str, torch.Tensor]) -> None:
        old = self.media[self.base][i]
        new = bk.pack(bucket, tensors, self._new(bucket, old))
        pos = changed(new, old)
        n = pos.numel()
        self.changed_values += n
        if n <= capacity(bucket):
            vals = new[pos]
            for arena in self.arenas.values():
                arena[2 * i][:n].copy_(pos)
                arena[2 * i + 1][:n].copy_(vals)
            self.counts[i] = n
        for name, bufs in self.media.items():
            if name in self.based and self.counts[i] is not None:
                if n:
                    bufs[i].index_copy_(0, pos.to(bufs[i].device), vals.to(bufs[i].device))
            else:
                bufs[i].copy_(new)


def messages(counts: Counts, buffers: Sequence[torch.Tensor], arena: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """What a collective path broadcasts, in order, on both ends: each dense bucket whole, each
    delta bucket's positions and values (nothing for a bucket where nothing changed)."""
    if counts is None:
        return list(buffers)
    out = []
    for i, (buf, n) in enumerate(zip(buffers, counts)):
        if n is None:
            out.append(buf)
        elif n:
            out += [arena[2 * i][:n], arena[2 * i + 1][:n]]
    return out


def receiving_arena(layout: bk.Layout, counts: Counts, device: torch.device) -> list[torch.Tensor]:
    """A receiver's arena for one push: exactly the changed values of each delta bucket."""
    out: list[torch.Tensor] = []
    for b, n in zip(layout.buckets, counts or []):
        n = n or 0
        out += [torch.empty(n, dtype=index_dtype(b), device=device), torch.empty(n, dtype=bk.torch_dtype(b.dtype),
                                                                                 device=device)]
    return out


def apply(counts: Counts, buffers: Sequence[torch.Tensor], arena: Sequence[torch.Tensor]) -> None:
    """Write each delta bucket's values at their positions, in place (the dense ones arrived whole)."""
    for i, (buf, n) in enumerate(zip(buffers, counts or [])):
        if n:
            buf.index_copy_(0, arena[2 * i][:n].to(buf.device, torch.int64), arena[2 * i + 1][:n].to(buf.device))


def copy_handoff(counts: Counts, buffers: Sequence[torch.Tensor], src: Sequence[torch.Tensor],
                 src_arena: Sequence[torch.Tensor]) -> None:
    """A same-host receiver's copy out of the trainer's buckets (`src`) and arena: the dense
    buckets whole, the delta buckets' changes straight from the arena into `buffers`."""
    with bk.host_copies(buffers):
        for i, buf in enumerate(buffers):
            n = None if counts is None else counts[i]
            if n is None:
                bk.wire(buf).copy_(bk.wire(src[i]))
        if counts is not None:
            apply(counts, buffers, src_arena)


def figures(layout: bk.Layout, counts: Counts, changed_values: Optional[int]) -> dict:
    """What one push sent to each receiver against the dense bytes (publisher stats "delta")."""
    sent = 0
    for i, b in enumerate(layout.buckets):
        n = None if counts is None else counts[i]
        esize = bk.torch_dtype(b.dtype).itemsize
        sent += b.nbytes if n is None else n * (index_dtype(b).itemsize + esize)
    return {"values": sum(b.numel for b in layout.buckets), "changed_values": changed_values,
            "sent_bytes": sent, "dense_bytes": layout.nbytes,
            "delta_buckets": 0 if counts is None else sum(n is not None for n in counts)}
