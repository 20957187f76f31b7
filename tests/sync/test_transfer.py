"""A transfer never blocks its caller past the deadline, even when queuing the collective blocks
(as NCCL's first broadcast does while it waits for every rank to connect)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from grpojob.sync import buckets as bk
from grpojob.sync import group as grp
from grpojob.sync.protocol import Deadline, WeightSyncError


class StuckGroup:
    """Stands in for a ProcessGroupNCCL whose communicator setup waits for a rank that never
    comes (NCCL cannot run on this machine): broadcast() blocks until released."""

    def __init__(self):
        self.release = threading.Event()

    def broadcast(self, tensors, opts):
        self.release.wait(60)
        raise RuntimeError("released")


def _layout():
    return bk.plan([(f"w{i}", (64,), torch.float32) for i in range(3)], bucket_bytes=256)


def test_a_blocked_setup_gives_up_at_the_deadline():
    layout, pg = _layout(), StuckGroup()
    start = time.monotonic()
    try:
        with pytest.raises(WeightSyncError, match=r"push: timed out after 1 s \(bucket 1 of 3 not queued\)"):
            grp.Transfer(pg, [bk.allocate(b) for b in layout.buckets]).wait(lambda: None, Deadline(1.0), "push")
    finally:
        pg.release.set()
    assert time.monotonic() - start < 3


def test_a_blocked_setup_gives_up_when_a_peer_is_reported_gone():
    layout, pg = _layout(), StuckGroup()
    reported = time.monotonic() + 0.3
    poll = lambda: "rollout server 'r1' failed to receive: boom" if time.monotonic() > reported else None  # noqa: E731
    try:
        with pytest.raises(WeightSyncError, match="push: rollout server 'r1' failed to receive: boom"):
            grp.Transfer(pg, [bk.allocate(b) for b in layout.buckets]).wait(poll, Deadline(30), "push")
    finally:
        pg.release.set()
    assert time.monotonic() - reported < 2


def test_an_error_while_queuing_is_reported_as_the_transfer_failure():
    layout, pg = _layout(), StuckGroup()
    pg.release.set()  # broadcast raises at once
    with pytest.raises(WeightSyncError, match=r"push: released \(bucket 1 of 3\)"):
        grp.Transfer(pg, [bk.allocate(b) for b in layout.buckets]).wait(lambda: None, Deadline(5), "push")
