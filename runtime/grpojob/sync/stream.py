"""A state dict that arrives one tensor at a time.

Names, shapes and dtypes are known up front (the bucket layout is planned from them); each tensor
is produced only when it is packed and dropped right after. A trainer produces it from its shards
(`DTensor.full_tensor()`, collective: every rank walks the stream in the same order, rank 0 packs
and the others `drain`), so no rank ever holds the whole model. The stream is ordered by dtype
(first appearance), the order in which `buckets.plan` lays the buckets out, so the buckets fill
one after the other and each can be sent as soon as it is full.

A LoRA trainer's stream holds only the adapter: `adapter` is then its PEFT config (the JSON of
adapter_config.json), which travels with the tensors so that the receiver applies them to the
base weights it keeps instead of replacing weights (`adapter.py`).

A stream counts the tensors it produced that are still alive (weak references): `peak_bytes` and
`peak_tensors` are the most of the gathered weights a push ever held at once.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch

from grpojob.sync import buckets as bk

Spec = tuple[str, tuple[int, ...], torch.dtype]


class TensorStream:
    def __init__(self, specs: Iterable[tuple[str, Sequence[int], torch.dtype]], fetch: Callable[[str], torch.Tensor],
                 *, track: bool | Callable[[str], bool] = True, adapter: Optional[dict] = None):
        """`fetch(name)`: the tensor (called once per name, in `specs` order); `track`: whether
        (or for which names) the produced tensor is a copy made for the stream, counted while it
        is alive (not a tensor that lives on anyway: a dict's, or a parameter itself); `adapter`:
        the PEFT config when the tensors are a LoRA adapter (PEFT's names), None for full weights."""
        self.adapter = adapter
        specs = [(n, tuple(map(int, shape)), dt) for n, shape, dt in specs]
        first: dict[torch.dtype, int] = {}
        for _, _, dt in specs:
            first.setdefault(dt, len(first))
        # stable: order kept within a dtype
        self.specs: list[Spec] = sorted(specs, key=lambda s: first[s[2]]) if len(first) > 1 else specs
        self._fetch, self._track = fetch, track
        self._at = 0
        self._lock = threading.Lock()
        self.live_tensors = self.live_bytes = self.peak_tensors = self.peak_bytes = 0

    @classmethod
    def gathered(cls, tensors: dict[str, torch.Tensor], dtype: Optional[torch.dtype] = None,
                 adapter: Optional[dict] = None) -> "TensorStream":
        """A model's own tensors (parameters, or DTensor shards under FSDP2), each produced full when
        taken (DTensor.full_tensor(): collective, every rank walks the stream) and, when floating
        point, in `dtype` if given. Only gathered or converted tensors count as the stream's copies."""
        from torch.distributed.tensor import DTensor

        def out_dtype(t: torch.Tensor) -> torch.dtype:
            return dtype if dtype is not None and t.is_floating_point() else t.dtype

        def fetch(name: str) -> torch.Tensor:
            t = tensors[name]
            full = t.full_tensor() if isinstance(t, DTensor) else t.detach()
            return full.to(out_dtype(t))

        def copied(name: str) -> bool:
            t = tensors[name]
            return isinstance(t, DTensor) or out_dtype(t) != t.dtype

        return cls([(n, tuple(t.shape), out_dtype(t)) for n, t in tensors.items()], fetch, track=copied,
                   adapter=adapter)

    @classmethod
    def of(cls, named: Iterable[tuple[str, torch.Tensor]], adapter: Optional[dict] = None) -> "TensorStream":
        """A stream over tensors already in memory (tied duplicates dropped, as buckets.dedup_tied)."""
        kept = bk.dedup_tied(named)
        table = dict(kept)
        return cls([(n, t.shape, t.dtype) for n, t in kept], table.__getitem__, track=False, adapter=adapter)

    @property
    def exhausted(self) -> bool:
        return self._at >= len(self.specs)

    def take(self, name: str) -> torch.Tensor:
        """The next tensor, which must be `name` (the consumer walks the layout in stream order)."""
        if self.exhausted or self.specs[self._at][0] != name:
            want = self.specs[self._at][0] if not self.exhausted else "nothing (the stream is exhausted)"
            raise RuntimeError(f"weight stream: asked for '{name}', next is {want}")
        self._at += 1
        t = self._fetch(name)
        if self._track is True or (callable(self._track) and self._track(name)):
            self._count(t)
        return t

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        while not self.exhausted:
            name = self.specs[self._at][0]
            yield name, self.take(name)

    def drain(self) -> None:
        """Produce (and drop) every tensor not taken yet: a trainer rank that does not push walks
        the stream alongside rank 0, and rank 0 finishes it after a failed push."""
        while not self.exhausted:
            self.take(self.specs[self._at][0])

    def _count(self, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        with self._lock:
            self.live_tensors += 1
            self.live_bytes += nbytes
            self.peak_tensors = max(self.peak_tensors, self.live_tensors)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(t, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.live_tensors -= 1
            self.live_bytes -= nbytes
