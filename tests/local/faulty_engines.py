"""Rollout engines that break, for the failure tests: the real hf engine, plugged in by reference
(`spec.rollout.backend: path/to/faulty_engines.py:Class`, the engine registry's user-code path),
with a fault injected through a public torch API (a forward pre-hook on the input embeddings, which
every prefill and decode step runs on the engine's scheduler thread: as a device error would).
No product code knows about them."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

from grpojob.rollout.engine import BUILTINS
from grpojob.rollout.hf_engine import HFEngine

ERROR = "injected: device lost"  # what the user must see on screen
ENV_MARKER = "FAULTY_ENGINE_MARKER"  # FailsOnce: the file saying the failure happened already
FAIL_AT_FORWARD = 30  # FailsOnce: a few steps into the run (a step is a prefill and ~4 decode steps)


class _Faulty(HFEngine):
    weight_sync = BUILTINS["hf"].weight_sync

    def break_at(self, n: int, then=None) -> None:
        calls = [0]

        def hook(module, args):
            calls[0] += 1
            if calls[0] >= n:
                if then is not None:
                    then()
                raise RuntimeError(ERROR)

        self.model.get_input_embeddings().register_forward_pre_hook(hook)


class FailsAlways(_Faulty):
    """Every start: the first prefill raises."""

    async def start(self) -> None:
        await super().start()
        self.break_at(1)


class FailsOnce(_Faulty):
    """The first start only, some steps into the run; the marker file remembers it."""

    async def start(self) -> None:
        await super().start()
        marker = Path(os.environ[ENV_MARKER])
        if not marker.exists():
            self.break_at(FAIL_AT_FORWARD, then=marker.touch)


class Stalls(_Faulty):
    """Up, but no generate request ever returns (a hung device)."""

    async def generate(self, prompt_ids, n, sampling):
        await asyncio.Event().wait()


class RaisesOnGenerate(_Faulty):
    """Up and healthy by its own account, but every generate() raises (a plug-in's bug)."""

    async def generate(self, prompt_ids, n, sampling):
        raise RuntimeError(ERROR)
