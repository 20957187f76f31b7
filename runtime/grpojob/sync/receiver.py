"""Receiving a push on one endpoint: over its route, into buffers on the right device.

Runs where the weights must land: in the rollout server process for the hf engine, inside each
vLLM worker (through the worker extension) for the vllm engine. One instance per process and
device; it keeps the latest group of each collective path, so consecutive pushes to the same
membership reuse them.

The buffers' device follows from the route, never from a guess: gloo and shm arrive in host
memory (the sink copies them to its device), nccl and cuda-ipc on this endpoint's GPU, and the
publisher routes those two only to endpoints that registered a GPU.

With delta pushes on (the command's "delta"), the buffers are kept on every path as the base of
the next push, with the weights id they hold: a delta is applied only onto that base (`delta`).
"""
from __future__ import annotations

import time
from typing import Optional

import torch
from torch.distributed import DistError

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync import group as grp
from grpojob.sync import handoff
from grpojob.sync import inband
from grpojob.sync.placement import COLLECTIVES
from grpojob.sync.protocol import Deadline, WeightSyncError, connect, key, short_error


class PushReceiver:
    def __init__(self, store_addr: str, instance: str, device: torch.device | str, *,
                 connect_timeout: float = 30.0):
        self.addr = store_addr
        self.instance = instance
        self.device = torch.device(device)
        self.store = connect(store_addr, connect_timeout)
        self.space = ""  # the publisher incarnation's key space, from each command
        self._groups: dict[str, tuple[str, object]] = {}  # path -> (group id, process group)
        self._kept: Optional[tuple[bk.Layout, torch.device, list[torch.Tensor]]] = None  # bucket buffers
        self._held: Optional[str] = None  # the weights id the kept buffers hold whole (a delta's base)
        self._views: Optional[list[tuple[str, torch.Tensor]]] = None  # named views into the kept buffers
        self._layout: tuple[Optional[str], Optional[bk.Layout]] = (None, None)  # (layout id, layout)
        self._shm, self._shm_delta = handoff.ShmReader(), handoff.ShmReader()
        self._cuda, self._cuda_delta = handoff.CudaReader(), handoff.CudaReader()
        # the last push's changes per bucket when it was a delta, else None (`changes`)
        self._changes: Optional[tuple[bk.Layout, list]] = None
        self._by_tensor: Optional[dict] = None

    @property
    def changes(self) -> Optional[dict]:
        """The last push's changes per tensor when it was a delta (`delta.by_tensor`), else None: a
        sink that holds the delta's base (cmd["delta"]["base"]) may write only these. Split per
        tensor when first asked: a sink that takes the buckets whole never pays for it (it was the
        whole of a CPU delta push's wait for acknowledgements: 2-6 ms for 291 tensors)."""
        if self._by_tensor is None and self._changes is not None:
            self._by_tensor = dl.by_tensor(*self._changes)
        return self._by_tensor

    def receive(self, cmd: dict, endpoint: int = 0) -> list[tuple[str, torch.Tensor]]:
        """The named tensors of push command `cmd` for this server's `endpoint` (a vLLM worker's
        rank); raises WeightSyncError naming the trainer and the path. `cmd["keyspace"]`: where
        the command's keys are (the agent adds it; see protocol)."""
        self.space = cmd["keyspace"]
        path = cmd["routes"][self.instance][endpoint]
        deadline = Deadline(float(cmd["timeout"]))
        what = (f"receiving weights version {cmd['version']} from the trainer at {self.addr} "
                f"over {path} failed")
        poll = self._poll(cmd["seq"])
        lid = cmd.get("layout_id")
        if lid is None or self._layout[0] != lid:  # parsed once per layout (0.6 ms for 291 tensors)
            self._layout = (lid, bk.Layout.from_json(cmd["layout"]))
        layout = self._layout[1]
        delta = cmd.get("delta")  # None: delta pushes are off
        counts = delta["counts"] if delta else None
        try:
            bufs = self._buffers(layout, path, what, keep=delta is not None)
            if delta and delta["base"] is not None and self._held != delta["base"]:
                raise WeightSyncError(f"{what}: it is a delta against {delta['base']}, but this endpoint holds "
                                      f"{self._held or 'no pushed version'}; the trainer sends it whole next time")
            self._held, self._changes, self._by_tensor, changes = None, None, None, []  # until this push is whole
            if path in COLLECTIVES:  # a delta's sizes come in band, bucket by bucket
                inbound = (inband.received(layout, bufs, delta.get("inline"), changes)
                           if delta and delta["base"] is not None else bufs)
                self._collective(cmd, path, endpoint, inbound, poll, deadline, what)
            elif path == "shm":
                arena = self._shm_delta.buffers(cmd["handoff"]["shm-delta"], dl.arena_layout(layout)) if counts else []
                dl.copy_handoff(counts, bufs, self._shm.buffers(cmd["handoff"]["shm"], layout), arena)
                changes = dl.recorded(counts, arena) if counts else []
            elif path == "cuda-ipc":
                h, dev = cmd["handoff"], self.device
                arena = self._cuda_delta.mapped(h["cuda-ipc-delta"][self.instance][endpoint], dev) if counts else []
                dl.copy_handoff(counts, bufs, self._cuda.mapped(h["cuda-ipc"][self.instance][endpoint], dev), arena)
                changes = dl.recorded(counts, arena) if counts else []
                torch.cuda.current_stream(self.device).synchronize()
            else:
                raise WeightSyncError(f"{what}: unknown path '{path}'")
            reason = poll()  # a handoff copy is whole only if the push still stands
            if reason:
                raise WeightSyncError(f"{what}: {reason}")
        except WeightSyncError as e:
            self._kept, self._held = None, None  # a failed transfer may still write into these until it times out
            self._views = None
            if path in COLLECTIVES:
                self._nack(cmd["seq"], path, e)
            raise
        self._held = cmd["weights"] if delta is not None else None
        if delta and delta["base"] is not None and len(changes) == len(layout.buckets):
            self._changes = (layout, changes)
        if self._kept is not None and bufs is self._kept[2]:  # views of kept buffers: made once (1 ms)
            if self._views is None:
                self._views = [nt for b, buf in zip(layout.buckets, bufs) for nt in bk.unpack(b, buf)]
            return list(self._views)
        return [nt for b, buf in zip(layout.buckets, bufs) for nt in bk.unpack(b, buf)]

    def _nack(self, seq: int, path: str, error: WeightSyncError) -> None:
        """Tell the publisher this endpoint's transfer failed (unless it cancelled the push
        itself), so it stops waiting on this group at once instead of at its deadline."""
        try:
            if not self.store.check([key(self.space, "cancel", seq)]):
                self.store.set(key(self.space, "nack", seq, path), f"{self.instance}\n{error}")
        except DistError:
            pass

    def _collective(self, cmd, path, endpoint, messages, poll, deadline, what) -> None:
        g = cmd["groups"][path]
        gid, world, rank = g["id"], g["world"], g["ranks"][self.instance][endpoint]
        what = f"{what} (group {gid}, rank {rank} of {world})"
        held = self._groups.get(path)
        if held is None or held[0] != gid:
            self._groups.pop(path, None)
            self.store.set(key(self.space, "join", gid, rank), "1")
            # The publisher sets rank 0's key once every member announced itself: only then
            # build the group, so nobody blocks in the rendezvous for a peer that is gone.
            while not self.store.check([key(self.space, "join", gid, 0)]):
                reason = poll()
                if reason or deadline.expired:
                    raise WeightSyncError(f"{what}: {reason or 'the group did not form in time'}")
                time.sleep(grp.POLL_SECONDS)
            try:
                pg = grp.new_group(self.store, self.space, gid, rank, world, path, deadline.left)
            except DistError as e:
                raise WeightSyncError(f"{what}: forming the group: {short_error(e)}") from e
            held = self._groups[path] = (gid, pg)
        try:
            grp.Transfer(held[1], messages).wait(poll, deadline, what)
        except WeightSyncError:
            grp.abandon(held[1], float(cmd["timeout"]))  # a broken group is never reused
            self._groups.pop(path, None)
            raise

    def _buffers(self, layout: bk.Layout, path: str, what: str, keep: bool = False) -> list[torch.Tensor]:
        """Host buffers are kept for the next push of the same layout: a fresh large allocation
        costs a page fault per 4 KiB on first touch (as much as the transfer itself on loopback).
        Sinks copy out of them before the next push starts. GPU buffers come from the caching
        allocator and are kept only with `keep` (delta pushes: the base; a model's worth of
        GPU memory)."""
        device = torch.device("cpu")
        if path in ("nccl", "cuda-ipc"):
            if self.device.type != "cuda":
                raise WeightSyncError(f"{what}: this endpoint computes on {self.device}, not a GPU")
            if not keep:
                return [bk.allocate(b, self.device) for b in layout.buckets]
            device = self.device
        if self._kept is None or self._kept[:2] != (layout, device):
            self._kept, self._held = (layout, device, [bk.allocate(b, device) for b in layout.buckets]), None
            self._views = None
        return self._kept[2]

    def _poll(self, seq: int):
        cancel = key(self.space, "cancel", seq)

        def poll() -> Optional[str]:
            try:
                if self.store.check([cancel]):
                    return "the trainer cancelled it: " + self.store.get(cancel).decode()
            except DistError:
                return f"lost the trainer's weight-sync store at {self.addr} (did the trainer die?)"
            return None
        return poll
