"""A delta push over a collective path (nccl, gloo): per bucket a header, then what it says.

The trainer publishes a delta push's command before it has compared a single bucket, so the
servers wake up, read the command and enter the group while it compares; the sizes then travel
in band. For each bucket, in order, once the trainer has compared it:

- a head of `inline[i]` bytes (the command says how many): a header, one int64, the number of
  values that changed or -1 when the bucket goes whole, then room for a payload: the changed
  positions (int32, or int64 past 2**31 values) followed, at the next multiple of 8 bytes, by
  their new values;
- then the bucket whole (-1), or the payload when it did not fit in the head, or nothing.

So comparing bucket i+1 overlaps sending bucket i, a bucket that changed little is one small
message (each message is a round trip between the sender and receivers that are waiting to
learn what comes next), and a receiver applies each bucket's change as soon as it arrived. The
publisher sizes the heads by what the last push changed (`inline_sizes`). Handoff paths
(cuda-ipc, shm) read the counts from the command instead: they copy once every bucket is packed.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence

import torch

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync.delta import payload_bytes, values_at
from grpojob.sync.protocol import WeightSyncError

WHOLE = -1
HEADER = 8  # the int64 at the start of each head


def split(bucket: bk.Bucket, n: int, payload: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions and values inside a payload of n changes."""
    at = values_at(bucket, n)
    isize, esize = dl.index_dtype(bucket).itemsize, bk.torch_dtype(bucket.dtype).itemsize
    return (payload[:n * isize].view(dl.index_dtype(bucket)),
            payload[at:at + n * esize].view(bk.torch_dtype(bucket.dtype)))


def inline_sizes(layout: bk.Layout, last: Optional[Sequence[Optional[int]]]) -> list[int]:
    """Each bucket's head in bytes: the header and room for a quarter more changes than the last
    delta push had in that bucket (1/1024 of its values for the first; none when it had none), in
    4 KiB steps, at most 1/64 of the bucket: the bytes a bucket that did not change costs, against
    a round trip saved."""
    out = []
    for i, b in enumerate(layout.buckets):
        n = last[i] if last is not None and last[i] is not None else b.numel // 1024
        room = -(-payload_bytes(b, n + n // 4) // 4096) * 4096
        out.append(HEADER + min(room, max(4096, b.nbytes // 64)))
    return out


def _fits(bucket: bk.Bucket, n: int, head: int) -> bool:
    return HEADER + payload_bytes(bucket, n) <= head


def sent(layout: bk.Layout, counts: Sequence[Optional[int]], buffers: Sequence[torch.Tensor],
         arena: Sequence[torch.Tensor], ready: Callable[[int], None],
         inline: Sequence[int]) -> Callable[[object], Iterator[torch.Tensor]]:
    """Rank 0's messages (for `group.Transfer`): `counts` is the delta packer's, read per bucket
    once `ready(i)` says bucket i is compared; the changes come from the medium's `arena`;
    `inline`: each bucket's head in bytes (`inline_sizes`, as the command says)."""
    def messages(_transfer) -> Iterator[torch.Tensor]:
        device = buffers[0].device if buffers else torch.device("cpu")
        starts = [0]  # each head at a multiple of 8 bytes: its header and values are viewed in place
        for size in inline:
            starts.append(starts[-1] + -(-size // 8) * 8)
        heads = torch.empty(starts[-1], dtype=torch.uint8, device=device)
        for i, (bucket, buf) in enumerate(zip(layout.buckets, buffers)):
            head = heads[starts[i]:starts[i] + inline[i]]
            ready(i)
            n = counts[i]
            head[:HEADER].view(torch.int64).fill_(WHOLE if n is None else n)
            if n is None:
                yield head
                yield buf
                continue
            fits = _fits(bucket, n, inline[i])  # nothing changed always fits
            msg = head[HEADER:] if fits else torch.empty(payload_bytes(bucket, n), dtype=torch.uint8, device=device)
            _put(bucket, n, msg, arena, i)
            yield head
            if not fits:
                yield msg  # alive until the transfer ends: it holds its iterator (broadcasts are asynchronous)
    return messages


def _put(bucket: bk.Bucket, n: int, msg: torch.Tensor, arena: Sequence[torch.Tensor], i: int) -> None:
    if n:
        pos, val = split(bucket, n, msg)
        pos.copy_(arena[2 * i][:n])
        val.copy_(arena[2 * i + 1][:n])


def received(layout: bk.Layout, buffers: Sequence[torch.Tensor], inline: Optional[Sequence[int]] = None,
             changes: Optional[list] = None) -> Callable[[object], Iterator[torch.Tensor]]:
    """A receiver's messages (for `group.Transfer`): each head is read as soon as it arrived,
    and each delta bucket's changes are written into `buffers` (the base) in place. `inline`:
    the command's head sizes (None: a bare header, as trainers before them sent); `changes`:
    each bucket's is appended to it (`delta.Changes`)."""
    inline = list(inline) if inline is not None else [HEADER] * len(layout.buckets)

    def messages(transfer) -> Iterator[torch.Tensor]:
        device = buffers[0].device if buffers else torch.device("cpu")
        heads = torch.empty(max(inline, default=HEADER), dtype=torch.uint8, device=device)
        for i, (bucket, buf) in enumerate(zip(layout.buckets, buffers)):
            head = heads[:inline[i]]
            yield head
            transfer.arrived()
            n = int(head[:HEADER].view(torch.int64).item())
            if not WHOLE <= n <= bucket.numel:
                raise WeightSyncError(f"a delta header says {n} values of a bucket of {bucket.numel} changed")
            pos = val = None
            if n == WHOLE:
                yield buf
            elif n:
                msg = head[HEADER:] if _fits(bucket, n, inline[i]) else None
                if msg is None:
                    msg = torch.empty(payload_bytes(bucket, n), dtype=torch.uint8, device=device)
                    yield msg
                    transfer.arrived()
                pos, val = split(bucket, n, msg)
                pos = pos.to(torch.int64, copy=True)  # a copy: the head is read again
                buf.index_copy_(0, pos, val)
            if changes is not None:
                changes.append(None if n == WHOLE else (pos, val.clone()) if n else (
                    torch.empty(0, dtype=torch.int64, device=device), buf[:0]))
    return messages
