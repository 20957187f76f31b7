"""Receiving a push: join the command's group and take the buckets (rollout side).

Runs where the weights must land: in the rollout server process for the hf engine, inside each
vLLM worker (through the worker extension) for the vllm engine. One instance per process; it
keeps the latest group so consecutive pushes to the same membership reuse it.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import torch
from torch.distributed import DistError

from . import buckets as bk
from . import group as grp
from .protocol import Deadline, WeightSyncError, connect, key

log = logging.getLogger("grpojob.sync")


class PushReceiver:
    def __init__(self, store_addr: str, instance: str, *, connect_timeout: float = 30.0):
        self.addr = store_addr
        self.instance = instance
        self.store = connect(store_addr, connect_timeout)
        self._group_id: Optional[str] = None
        self._pg = None
        self._kept: Optional[tuple[bk.Layout, list[torch.Tensor]]] = None  # host bucket buffers

    def receive(self, cmd: dict, local_rank: int = 0,
                device: torch.device | str = "cpu") -> list[tuple[str, torch.Tensor]]:
        """The named tensors of push command `cmd`; raises WeightSyncError naming the trainer."""
        rank = cmd["ranks"][self.instance] + local_rank
        seq, gid, world = cmd["seq"], cmd["group"], cmd["world"]
        deadline = Deadline(float(cmd["timeout"]))
        what = (f"receiving weights version {cmd['version']} from the trainer at {self.addr} "
                f"(group {gid}, rank {rank} of {world}) failed")
        poll = self._poll(seq)
        if gid != self._group_id:
            self._pg, self._group_id = None, None
            self.store.set(key("join", gid, rank), "1")
            # The publisher sets rank 0's key once every member announced itself: only then
            # build the group, so nobody blocks in the rendezvous for a peer that is gone.
            while not self.store.check([key("join", gid, 0)]):
                reason = poll()
                if reason or deadline.expired:
                    raise WeightSyncError(f"{what}: {reason or 'the group did not form in time'}")
                time.sleep(grp.POLL_SECONDS)
            try:
                self._pg = grp.new_group(self.store, gid, rank, world, cmd["backend"], deadline.left)
            except DistError as e:
                raise WeightSyncError(f"{what}: forming the group: {grp._short(e)}") from e
            self._group_id = gid
        try:
            layout = bk.Layout.from_json(cmd["layout"])
            return grp.receive(self._pg, layout, self._buffers(layout, device), poll, deadline, what)
        except WeightSyncError:
            grp.abandon(self._pg, float(cmd["timeout"]))  # a broken group is never reused
            self._pg, self._group_id = None, None
            self._kept = None  # its transfers may still write into these until they time out
            raise

    def _buffers(self, layout: bk.Layout, device) -> list[torch.Tensor]:
        """Host buffers are kept for the next push of the same layout: a fresh large allocation
        costs a page fault per 4 KiB on first touch (as much as the transfer itself on loopback).
        Sinks copy out of them before the next push starts. GPU buffers come from the caching
        allocator and are not kept (they would hold a model's worth of GPU memory)."""
        if torch.device(device).type != "cpu":
            return [bk.allocate(b, device) for b in layout.buckets]
        if self._kept is None or self._kept[0] != layout:
            self._kept = (layout, [bk.allocate(b, "cpu") for b in layout.buckets])
        return self._kept[1]

    def _poll(self, seq: int):
        cancel = key("cancel", seq)

        def poll() -> Optional[str]:
            try:
                if self.store.check([cancel]):
                    return "the trainer cancelled it: " + self.store.get(cancel).decode()
            except DistError:
                return f"lost the trainer's weight-sync store at {self.addr} (did the trainer die?)"
            return None
        return poll
