"""The rollout engine interface, the engine registry, and the factory the server uses.

`spec.rollout.backend` names a built-in engine (hf, vllm: registered here by name) or an engine
class by reference ('module:Class' or 'path/to/file.py:Class'), constructed as `Class(spec)` (it
reads its own settings from spec.rollout.engineArgs). An engine class implements `Engine` below
and declares, as class attributes, its `backend` name and the `weight_sync` paths it can receive
(see grpojob.sync.placement), which `grpojob validate` checks against spec.weightSync.backend.

An engine generates completions for token-id prompts (the `Generator` contract of `types.py`,
plus bookkeeping) and is the `WeightSink` that weight sync loads into. Engines tag every
completion with the policy version of the weights that produced its tokens. When weights arrive
while requests are being generated (algorithm.partialRollouts): false — the requests in flight
finish on the old weights and carry the old version, new ones wait for the load; true — the
requests in flight are stopped and go on from their tokens so far on the new weights, each token
keeping the version that produced it (`Completion.versions`). Either way `last_pause_seconds`
tells how long the last load kept generation from running.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Optional

from grpojob.api import plugins
from grpojob.api.colocation import COLOCATED
from grpojob.api.spec import GRPOJobSpec
from grpojob.contracts.protocols import Engine  # noqa: F401 - the contract's documented home (spec.rollout.backend)

ALL_SYNC = ("auto", "nccl", "cuda-ipc", "shm", "gloo", "checkpoint")  # spec.weightSync.backend values


@dataclass(frozen=True)
class Builtin:
    cls: str  # module:Class, imported only when used (vLLM is heavy; the hf engine imports torch)
    weight_sync: tuple[str, ...]


# The built-in engines, registered by name (their classes stay free of this registry).
BUILTINS = {
    "vllm": Builtin("grpojob.rollout.vllm_engine:VLLMEngine", ALL_SYNC),
    "hf": Builtin("grpojob.rollout.hf_engine:HFEngine", tuple(p for p in ALL_SYNC if p != "nccl")),
}
assert tuple(BUILTINS) == plugins.BUILTIN_ENGINES, "engine registry out of step with the API"
_METHODS = ("start", "generate", "load_info", "endpoints", "receive_push", "load_dir", "errored", "close")
_ASYNC = ("start", "generate", "close")


def check_class(cls) -> Optional[str]:
    """Why `cls` is not an engine class, or None."""
    if not inspect.isclass(cls):
        return "is not a class (an engine class implementing grpojob.rollout.engine.Engine is expected)"
    missing = [m for m in _METHODS if not callable(getattr(cls, m, None))]
    if missing:
        return f"lacks the Engine methods {', '.join(missing)} (see grpojob.rollout.engine.Engine)"
    not_async = [m for m in _ASYNC if not inspect.iscoroutinefunction(getattr(cls, m))]
    if not_async:
        return f"must define {', '.join(not_async)} with `async def`"
    sync = getattr(cls, "weight_sync", None)
    if not isinstance(sync, tuple) or not sync or set(sync) - set(ALL_SYNC):
        return f"must declare weight_sync, a tuple of the weightSync.backend values it receives ({', '.join(ALL_SYNC)})"
    if not isinstance(getattr(cls, "backend", None), str):
        return "must declare backend, its name (a str class attribute)"
    if not isinstance(getattr(cls, "delta_files", False), bool):
        return "declares delta_files, which must be True (its load_dir applies delta versions) or False"
    if sleeps(cls) and not all(inspect.iscoroutinefunction(getattr(cls, m, None)) for m in ("sleep", "wake")):
        return "declares sleep_mode, and must define sleep and wake with `async def`"
    return None


def sleeps(cls) -> bool:
    """The engine class declares sleep mode (`sleep_mode = True`): it can be colocated."""
    return getattr(cls, "sleep_mode", False) is True


def applies_file_deltas(cls) -> bool:
    """The engine class declares `delta_files = True`: its `load_dir` also applies delta versions
    (backend checkpoint with weightSync.delta: grpojob.sync.files.read_delta)."""
    return getattr(cls, "delta_files", False) is True


def engine_class(backend: str):
    """The class `backend` names: a built-in, or a checked reference (ValueError naming the field)."""
    if backend in BUILTINS:
        module, _, name = BUILTINS[backend].cls.partition(":")
        return getattr(importlib.import_module(module), name)
    return plugins.load_checked(backend, "spec.rollout.backend", check_class, ValueError)


def weight_sync(backend: str) -> tuple[str, ...]:
    """The weightSync.backend values the engine `backend` receives."""
    return BUILTINS[backend].weight_sync if backend in BUILTINS else engine_class(backend).weight_sync


def torch_dtype_name(dtype: str, on_gpu: bool) -> str:
    """spec.model.dtype with auto resolved: bfloat16 on GPU, float32 on CPU."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_gpu else "float32"


def build(backend: str, spec: GRPOJobSpec) -> Engine:
    """The engine `backend` names (a built-in or a reference), constructed from the spec."""
    err = plugins.check_name("engine", backend)
    if err:
        raise ValueError(f"spec.rollout.backend: {err}")
    cls = engine_class(backend)
    if spec.placement == COLOCATED and not sleeps(cls):
        raise ValueError(f"spec.rollout.backend: the engine {backend} has no sleep mode (sleep_mode = True, "
                         "async sleep and wake), which placement colocated needs")
    if backend not in BUILTINS and spec.weight_sync.backend not in cls.weight_sync:
        raise ValueError(f"spec.weightSync.backend: {spec.weight_sync.backend}: the engine {backend} receives "
                         f"{', '.join(cls.weight_sync)} (its weight_sync)")
    return cls(spec)


def check_prompt(prompt_ids: list[int], vocab_size: int, limit: int) -> Optional[str]:
    """Why a prompt cannot be generated from, or None."""
    if not prompt_ids:
        return "prompt_ids is empty"
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        return f"prompt_ids holds token ids outside the vocabulary (size {vocab_size}): {bad[:5]}"
    if len(prompt_ids) >= limit:
        return f"prompt of {len(prompt_ids)} tokens does not fit the context ({limit} tokens)"
    return None


class Refused(Exception):
    """A request the rollout server answers with an error: 400 (its own fault) or 503 (the engine broke)."""

    def __init__(self, status: int, message: str, result: str):
        super().__init__(message)
        self.status, self.result = status, result
