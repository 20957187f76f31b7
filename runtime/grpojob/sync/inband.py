"""A delta push over a collective path (nccl, gloo): per bucket a header, then what it says.

The trainer publishes a delta push's command before it has compared a single bucket, so the
servers wake up, read the command and enter the group while it compares; the sizes then travel
in band. For each bucket, in order, once the trainer has compared it:

- a header: one int64, the number of values that changed, or -1 when the bucket goes whole;
- then the bucket whole (-1), nothing (0), or one payload: the changed positions (int32, or
  int64 past 2**31 values) followed, at the next multiple of 8 bytes, by their new values.

So comparing bucket i+1 overlaps sending bucket i, a bucket that changed little is two small
messages, and a receiver applies each bucket's change as soon as it arrived. Handoff paths
(cuda-ipc, shm) read the counts from the command instead: they copy once every bucket is packed.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import torch

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync.protocol import WeightSyncError

WHOLE = -1


def _values_at(bucket: bk.Bucket, n: int) -> int:
    """Byte offset of the values in a payload of n changes (8-aligned: any dtype can view it)."""
    return -(-n * dl.index_dtype(bucket).itemsize // 8) * 8


def payload_bytes(bucket: bk.Bucket, n: int) -> int:
    return _values_at(bucket, n) + n * bk.torch_dtype(bucket.dtype).itemsize


def split(bucket: bk.Bucket, n: int, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions and values inside a payload of n changes."""
    at = _values_at(bucket, n)
    isize, esize = dl.index_dtype(bucket).itemsize, bk.torch_dtype(bucket.dtype).itemsize
    return (payload[:n * isize].view(dl.index_dtype(bucket)),
            payload[at:at + n * esize].view(bk.torch_dtype(bucket.dtype)))


def sent(layout: bk.Layout, counts: Sequence[Optional[int]], buffers: Sequence[torch.Tensor],
         arena: Sequence[torch.Tensor], ready: Callable[[int], None]) -> Callable[[object], Iterator[torch.Tensor]]:
    """Rank 0's messages (for `group.Transfer`): `counts` is the delta packer's, read per bucket
    once `ready(i)` says bucket i is compared; the changes come from the medium's `arena`."""
    def messages(_transfer) -> Iterator[torch.Tensor]:
        device = buffers[0].device if buffers else torch.device("cpu")
        heads = torch.empty(len(buffers), dtype=torch.int64, device=device)
        keep = []  # each message stays alive until the transfer ends (broadcasts are asynchronous)
        for i, (bucket, buf) in enumerate(zip(layout.buckets, buffers)):
            ready(i)
            n = counts[i]
            heads[i:i + 1].fill_(WHOLE if n is None else n)
            yield heads[i:i + 1]
            if n is None:
                yield buf
            elif n:
                msg = torch.empty(payload_bytes(bucket, n), dtype=torch.uint8, device=device)
                pos, val = split(bucket, n, msg)
                pos.copy_(arena[2 * i][:n])
                val.copy_(arena[2 * i + 1][:n])
                keep.append(msg)
                yield msg
    return messages


def received(layout: bk.Layout, buffers: Sequence[torch.Tensor]) -> Callable[[object], Iterator[torch.Tensor]]:
    """A receiver's messages (for `group.Transfer`): each header is read as soon as it arrived,
    and each delta bucket's changes are written into `buffers` (the base) in place."""
    def messages(transfer) -> Iterator[torch.Tensor]:
        device = buffers[0].device if buffers else torch.device("cpu")
        head = torch.empty(1, dtype=torch.int64, device=device)
        for bucket, buf in zip(layout.buckets, buffers):
            yield head
            transfer.arrived()
            n = int(head.item())
            if not WHOLE <= n <= bucket.numel:
                raise WeightSyncError(f"a delta header says {n} values of a bucket of {bucket.numel} changed")
            if n == WHOLE:
                yield buf
            elif n:
                msg = torch.empty(payload_bytes(bucket, n), dtype=torch.uint8, device=device)
                yield msg
                transfer.arrived()
                pos, val = split(bucket, n, msg)
                buf.index_copy_(0, pos.to(torch.int64), val)
    return messages
