"""The trainer's retained version: what `delivery` pushes from, and what a delta is taken against.

`Retained` holds the last pushed version's layout and the media holding its buckets (one copy of
the weights per medium in use), plus, with delta pushes (`delta`), the arena of positions and
values in the media that need it. `Base` names the version the media held before the push now
being packed: a delta goes only to servers holding it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from grpojob.sync import buckets as bk
from grpojob.sync import delta as dl
from grpojob.sync import handoff
from grpojob.sync.credentials import Credentials, canonical
from grpojob.sync.membership import Member
from grpojob.sync.protocol import WeightSyncError


def home(device: torch.device) -> str:
    """The medium a version is kept in for servers that come later (and, with backend checkpoint,
    compared with the next one in): the trainer's device."""
    return "device" if device.type == "cuda" else "host"


@dataclass(frozen=True)
class Base:
    """The previous push a delta is taken against: its weights id and the media that hold it whole."""
    weights: str
    media: frozenset[str]


@dataclass
class Retained:
    """The last pushed version: its layout and the media holding its buckets."""
    layout: bk.Layout
    version: int = -1
    weights: str = ""
    path: Optional[str] = None  # backend checkpoint: the saved version, relative to the checkpoint dir
    adapter: Optional[dict] = None  # LoRA: the adapter's PEFT config (the buckets hold only the adapter)
    media: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    filled: set[str] = field(default_factory=set)  # media holding this version
    shm: Optional[handoff.ShmSegment] = None
    # cuda-ipc: each receiver endpoint's share of media["device"], made once (a share wraps the
    # storage in one more reference-counting layer, which goes only with the storage)
    ipc: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    base: Optional[Base] = None  # delta pushes: what the filled media held before this version
    arena: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # medium -> delta positions/values
    arena_shm: Optional[handoff.ShmSegment] = None
    arena_ipc: dict[tuple[str, int], list[dict]] = field(default_factory=dict)
    layout_id: Optional[str] = None  # the id its layout is published under (commands name it)
    last_counts: Optional[list] = None  # the last delta push's changes per bucket (sizes the next one's heads)

    def buffers(self, medium: str, device: torch.device, shm_path: Callable[[], Path],
                arena: bool = False) -> list[torch.Tensor]:
        """The buckets in `medium` ("device": on `device`; `arena`: the delta arena there), made on first use."""
        held, layout = (self.arena, dl.arena_layout(self.layout)) if arena else (self.media, self.layout)
        if medium not in held:
            if medium == "shm":
                seg = handoff.ShmSegment(shm_path(), layout)
                self.arena_shm, self.shm = (seg, self.shm) if arena else (self.arena_shm, seg)
                held["shm"] = seg.buffers
            else:
                on = device if medium == "device" else torch.device("cpu")
                held[medium] = [bk.allocate(b, on) for b in layout.buckets]
        return held[medium]

    def publish_layout(self, creds: Credentials, store) -> str:
        """The id push commands name the layout by, published (sealed) under `layout/<id>` the first
        time: its JSON (18 KB for 291 tensors) cost every receiver 2 ms to verify and parse a push."""
        if self.layout_id is None:
            doc = self.layout.to_json()
            self.layout_id = hashlib.sha256(canonical(doc).encode()).hexdigest()[:16]
            creds.set_json(store, creds.key("layout", self.layout_id), doc)
        return self.layout_id

    def copy_into(self, medium: str, buffers: list[torch.Tensor], device: torch.device) -> None:
        """Put this version into `medium`'s `buffers` from a medium that holds it."""
        if medium in self.filled:
            return
        if not self.filled:
            raise WeightSyncError(f"weights version {self.version} are not retained anywhere")
        for s, d in zip(self.media[next(iter(self.filled))], buffers):
            d.copy_(s)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        self.filled.add(medium)

    def close(self) -> None:
        for seg in (self.shm, self.arena_shm):
            if seg:
                seg.close()
        for d in (self.media, self.ipc, self.arena, self.arena_ipc):
            d.clear()
        self.filled.clear()


@dataclass
class Outcome:
    ok: list[Member]
    dropped: list[Member]
    paused_seconds: Optional[float] = None  # the longest a server's generation stopped for it

    @property
    def paths(self) -> dict[str, list[str]]:
        """path -> replicas that took it (a server with endpoints on two paths counts on both)."""
        out: dict[str, list[str]] = {}
        for m in self.ok:
            for p in dict.fromkeys(m.routes):
                out.setdefault(p, []).append(m.replica)
        return out
