"""What a rollout engine plug-in needs to receive the trainer's weights, and nothing more.

The contract (the Engine protocol's weight half, docs/plugins.md#rollout-engines):

- `WeightReceiver(device)`: one per engine, for the device the engine's model lives on.
- `endpoints()` is what the engine's `endpoints()` returns: the trainer picks each push's path
  (nccl, cuda-ipc, shm, gloo) from it.
- `receive(cmd, store_addr, instance)`, called from the engine's `receive_push` with its three
  arguments unchanged, returns every pushed tensor as (Hugging Face name, tensor), on `device` for
  the GPU paths and in host memory otherwise (copy them into the model). It blocks until the push
  is whole and raises WeightSyncError (a RuntimeError naming the trainer and the path) when it is
  not; the engine must then keep its old weights and version.
- `read_dir(path)` gives the same pairs from a model directory (the engine's `load_dir`).
- An engine class that declares `delta_files = True` also gets delta versions in `load_dir` (backend
  checkpoint with weightSync.delta): `is_delta(path)` tells them apart, `read_delta(path)` gives
  `.base` (the weights id they apply to: raise unless it is the engine's `weights`), `.changes`
  ({name: (flat positions, new values)} for each tensor that changed, None for one in `.whole`)
  and `.whole` ({name: tensor}); tensors not named did not change.
- `INITIAL_WEIGHTS` is the `weights` id of the model on disk, an engine's value before any push.

The sync internals (grpojob.sync: routes, buckets, key spaces) may change in any release; this
module's names and their behaviour above are the stable part (CHANGELOG.md, version policy).
"""
from __future__ import annotations

import os
from typing import Iterator, Optional

import torch

from grpojob.sync import files, placement, tensorfiles
from grpojob.sync.protocol import DISK, WeightSyncError
from grpojob.sync.receiver import PushReceiver

INITIAL_WEIGHTS = DISK

__all__ = ["INITIAL_WEIGHTS", "WeightReceiver", "WeightSyncError", "is_delta", "read_delta", "read_dir"]


def read_dir(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every *.safetensors tensor in a model directory, one at a time."""
    return tensorfiles.iter_dir(path)


def is_delta(path: str | os.PathLike) -> bool:
    """Whether a directory `load_dir` got is a delta version (only for engines declaring delta_files)."""
    return files.is_delta(path)


def read_delta(path: str | os.PathLike) -> files.Delta:
    """A delta version: `.base`, `.changes`, `.whole` (see the module doc)."""
    return files.read_delta(path)


class WeightReceiver:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._push: Optional[PushReceiver] = None  # kept: consecutive pushes reuse its groups and buffers

    def endpoints(self) -> list[placement.Endpoint]:
        return [placement.local(self.device)]

    def receive(self, cmd: dict, store_addr: str, instance: str) -> list[tuple[str, torch.Tensor]]:
        p = self._push
        if p is None or (p.addr, p.instance) != (store_addr, instance):  # a new trainer incarnation
            p = self._push = PushReceiver(store_addr, instance, self.device)
        return p.receive(cmd)
