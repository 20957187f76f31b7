"""The standalone collective group of one weight push, and the bucket transfer over it.

The group is a c10d ProcessGroup built directly on the publisher's TCPStore (under a prefix per
group id), never torch.distributed's default group: the trainer's own ranks and vLLM's workers
keep theirs untouched. Rank 0 is trainer rank 0; rollout workers take ranks 1..n.

Every wait polls: the sender checks that its peers are alive (heartbeats), the receiver checks
that the push was not cancelled and the store is still there, and both give up at the deadline.
c10d cannot abort a collective that is in flight (gloo's abort does not wake a blocked send), so
giving up means abandoning the group: its buffers are freed when gloo's own timeout fires.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Callable, Optional, Sequence

import torch
from torch.distributed import BroadcastOptions, PrefixStore, TCPStore

from . import buckets as bk
from .protocol import Deadline, WeightSyncError, key

log = logging.getLogger("grpojob.sync")

POLL_SECONDS = 0.01
Poll = Callable[[], Optional[str]]  # returns a reason to give up, or None


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """auto: NCCL when the weights live on a GPU, else gloo (checkpoint is not a collective)."""
    if backend == "auto":
        return "nccl" if torch.device(device).type == "cuda" else "gloo"
    return backend


def new_group(store: TCPStore, group_id: str, rank: int, world: int, backend: str, timeout: float):
    """A ProcessGroup of `world` ranks rendezvousing under this group id (blocks until all join)."""
    prefixed = PrefixStore(key("pg", group_id) + "/", store)
    span = datetime.timedelta(seconds=timeout)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo
        return ProcessGroupGloo(prefixed, rank, world, span)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL
        opts = ProcessGroupNCCL.Options()
        opts._timeout = span
        return ProcessGroupNCCL(prefixed, rank, world, opts)
    raise ValueError(f"unknown weight-sync backend '{backend}'")


def abandon(pg, seconds: float) -> None:
    """Let go of a group whose collectives may still be blocked: its destructor waits for them
    (up to their timeout), so a daemon thread holds the last reference until then."""
    if pg is None:
        return
    holder = [pg]
    threading.Thread(target=lambda: (time.sleep(seconds + 5), holder.clear()), daemon=True,
                     name="grpojob-sync-abandoned-group").start()


def wait_all(works: Sequence, poll: Poll, deadline: Deadline, what: str) -> None:
    """Wait for collective works in order, giving up when poll() names a reason or time runs out."""
    for i, w in enumerate(works):
        fut = w.get_future()
        done = threading.Event()
        fut.add_done_callback(lambda _f: done.set())
        while not done.wait(POLL_SECONDS):
            reason = poll()
            if reason:
                raise WeightSyncError(f"{what}: {reason} (bucket {i + 1} of {len(works)})")
            if deadline.expired:
                raise WeightSyncError(f"{what}: timed out after {deadline.seconds:.0f} s "
                                      f"(bucket {i + 1} of {len(works)} not complete)")
        try:
            fut.wait()
        except Exception as e:  # the collective's own error (peer closed the connection, ...)
            raise WeightSyncError(f"{what}: {_short(e)} (bucket {i + 1} of {len(works)})") from e


def send(pg, layout: bk.Layout, buffers: Sequence[torch.Tensor], tensors: Optional[dict], poll: Poll,
         deadline: Deadline, what: str) -> None:
    """Broadcast every bucket from rank 0. With `tensors`, pack each bucket just before its
    broadcast is queued, so packing bucket i+1 overlaps sending bucket i."""
    opts = BroadcastOptions()
    opts.rootRank = 0
    works = []
    with bk.host_copies(buffers):
        for b, buf in zip(layout.buckets, buffers):
            if tensors is not None:
                bk.pack(b, tensors, buf)
                if buf.is_cuda:
                    torch.cuda.current_stream(buf.device).synchronize()
            works.append(pg.broadcast([bk.wire(buf)], opts))
    wait_all(works, poll, deadline, what)


def receive(pg, layout: bk.Layout, bufs: Sequence[torch.Tensor], poll: Poll, deadline: Deadline,
            what: str) -> list[tuple[str, torch.Tensor]]:
    """Receive every bucket into `bufs`; named views once all have arrived (so a failed push
    never leaves a half-updated model behind)."""
    opts = BroadcastOptions()
    opts.rootRank = 0
    works = [pg.broadcast([bk.wire(buf)], opts) for buf in bufs]
    wait_all(works, poll, deadline, what)
    return [nt for b, buf in zip(layout.buckets, bufs) for nt in bk.unpack(b, buf)]


def _short(e: BaseException) -> str:
    """gloo's messages start with a source path; keep what a reader needs."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.replace(" GLHF!", "").replace(" 🏖️", "")
