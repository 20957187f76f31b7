"""The standalone collective group of one weight push, and the bucket transfer over it.

The group is a c10d ProcessGroup built directly on the publisher's TCPStore (under a prefix per
group id, in the incarnation's private key space: `credentials`), never torch.distributed's
default group: the trainer's own ranks and vLLM's workers keep theirs untouched. Rank 0 is
trainer rank 0; the receiving endpoints take ranks 1..n.

Every wait is bounded. The broadcasts are queued on a thread of their own (`Transfer`): NCCL
builds its communicator inside the first collective and waits there for every rank, which
no caller could interrupt. The caller meanwhile polls: the sender checks that its peers are
alive and none reported a failure, the receiver checks that the push was not cancelled and the
store is still there, and both give up at the deadline. c10d cannot reliably abort a collective in
flight (gloo's abort does not wake a blocked send), so giving up means abandoning the group: its
buffers are freed when the collective's own timeout fires.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch.distributed import BroadcastOptions, PrefixStore, TCPStore

from grpojob.sync import buckets as bk
from grpojob.sync.protocol import Deadline, WeightSyncError, key, short_error

log = logging.getLogger("grpojob.sync")

POLL_SECONDS = 0.01
Poll = Callable[[], Optional[str]]  # returns a reason to give up, or None


def new_group(store: TCPStore, space: str, group_id: str, rank: int, world: int, backend: str, timeout: float):
    """A ProcessGroup of `world` ranks rendezvousing under this group id in key space `space`
    (gloo blocks until all join; NCCL connects in its first collective)."""
    prefixed = PrefixStore(key(space, "pg", group_id) + "/", store)
    span = datetime.timedelta(seconds=max(1.0, timeout))
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo
        return ProcessGroupGloo(prefixed, rank, world, span)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL
        opts = ProcessGroupNCCL.Options()
        opts._timeout = span
        return ProcessGroupNCCL(prefixed, rank, world, opts)
    raise ValueError(f"'{backend}' is not a collective weight-sync path")


def abandon(pg, seconds: float) -> None:
    """Let go of a group whose collectives may still be blocked. NCCL's communicator is aborted
    (that wakes its waiters); gloo's destructor waits for its collectives (up to their timeout),
    so a daemon thread holds the last reference until then."""
    if pg is None:
        return
    holder = [pg]

    def release():
        if type(pg).__name__ == "ProcessGroupNCCL":
            try:
                pg.abort()
            except Exception as e:  # already broken: nothing left to abort
                log.debug("aborting an abandoned NCCL group: %s", short_error(e))
        time.sleep(seconds + 5)
        holder.clear()
    threading.Thread(target=release, daemon=True, name="grpojob-sync-abandoned-group").start()


class Transfer:
    """Broadcast messages from rank 0 (send) or into them (receive), queued on a thread.
    `messages`: the tensors in order, or a function of the transfer returning an iterator that
    produces them on that thread (a delta push's messages follow per-bucket headers: the
    receiving iterator reads each header with `arrived()` before it says what comes next,
    `inband`). Sending with `ready`: message i is
    broadcast once `ready(i)` returns (it blocks until the publisher packed bucket i; it raises
    when packing failed), so packing bucket i+1 overlaps sending bucket i."""

    def __init__(self, pg, messages: Sequence[torch.Tensor] | Callable[["Transfer"], Iterator[torch.Tensor]], *,
                 ready: Optional[Callable[[int], None]] = None):
        self.pg, self.messages, self.ready = pg, messages, ready
        self.works: list = []
        self.error: Optional[BaseException] = None
        self._queued = threading.Event()
        threading.Thread(target=self._queue, daemon=True, name="grpojob-sync-transfer").start()

    def arrived(self) -> None:
        """On the queueing thread: block until the last queued broadcast completed."""
        self.works[-1].wait()

    def _queue(self) -> None:
        opts = BroadcastOptions()
        opts.rootRank = 0
        try:
            source = self.messages(self) if callable(self.messages) else self.messages
            for i, buf in enumerate(source):
                if self.ready is not None:
                    self.ready(i)
                self.works.append(self.pg.broadcast([bk.wire(buf)], opts))
        except BaseException as e:  # noqa: BLE001 - reported by wait(), in the caller's thread
            self.error = e
        finally:
            self._queued.set()

    def wait(self, poll: Poll, deadline: Deadline, what: str) -> None:
        """Until every message has arrived (called buckets in errors: most are); WeightSyncError
        when poll() names a reason, the deadline passes, or the collective fails."""
        n = None if callable(self.messages) else len(self.messages)  # None: as many as the iterator makes
        of = f" of {n}" if n is not None else ""
        i = 0
        while n is None or i < n:
            while len(self.works) <= i and not self._queued.wait(POLL_SECONDS):
                self._check(poll, deadline, what, f"bucket {i + 1}{of} not queued")
            if len(self.works) <= i:
                e = self.error
                if e is None and n is None:
                    return  # the iterator ended: everything it produced has arrived
                raise WeightSyncError(f"{what}: {short_error(e) if e else 'nothing was sent'} "
                                      f"(bucket {i + 1}{of})") from e
            fut = self.works[i].get_future()
            done = threading.Event()
            fut.add_done_callback(lambda _f: done.set())
            while not done.wait(POLL_SECONDS):
                self._check(poll, deadline, what, f"bucket {i + 1}{of} not complete")
            try:
                fut.wait()
            except Exception as e:  # the collective's own error (peer closed the connection, ...)
                raise WeightSyncError(f"{what}: {short_error(e)} (bucket {i + 1}{of})") from e
            i += 1

    @staticmethod
    def _check(poll: Poll, deadline: Deadline, what: str, where: str) -> None:
        reason = poll()
        if reason:
            raise WeightSyncError(f"{what}: {reason} ({where})")
        if deadline.expired:
            raise WeightSyncError(f"{what}: timed out after {deadline.seconds:.0f} s ({where})")
