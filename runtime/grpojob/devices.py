"""Which device a process computes on: one rule for the trainer, the rollout engines and weight sync.

GRPOJOB_DEVICE pins it (`cpu`, `cuda`, or `cuda:N`); unset, a process uses its local GPU when it
has one and the CPU otherwise. Tests pin `cpu` so they behave the same on any machine; GPU tests
pin `cuda`. torch is imported only when a device is asked for (the core package stays light).
"""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Optional

ENV_DEVICE = "GRPOJOB_DEVICE"


class DeviceError(RuntimeError):
    pass


def requested() -> str | None:
    """The pinned device kind ('cpu' or 'cuda[:N]'), or None."""
    value = os.environ.get(ENV_DEVICE, "").strip()
    if not value:
        return None
    kind, _, index = value.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdecimal()) or (kind == "cpu" and index):
        raise DeviceError(f"{ENV_DEVICE}={value!r}: use cpu, cuda or cuda:N")
    return value


def default(local_rank: int = 0):
    """This process's torch.device: the pinned one, else GPU `local_rank` (mod the GPU count), else CPU."""
    import torch

    want = requested()
    if want == "cpu" or (want is None and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"{ENV_DEVICE}={want}: no CUDA device is visible to this process")
    if want and ":" in want:
        return torch.device(want)
    return torch.device("cuda", local_rank % torch.cuda.device_count())


@contextlib.contextmanager
def intra_op_threads(k: Optional[int]):
    """This thread's intra-op thread count is k inside (torch sets OpenMP's and MKL's per-thread
    counts: other threads keep theirs); None: unchanged. Small ops on a shared pool pay a fork and
    join each, which a busy core turns into milliseconds (sync.buckets, rollout.hf_decode_step)."""
    import torch

    before = torch.get_num_threads()
    if not k or k == before:
        yield
        return
    torch.set_num_threads(k)
    try:
        yield
    finally:
        torch.set_num_threads(before)


OMP_PAUSE_SOFT = 1  # omp_pause_resource_t (OpenMP 5.0): threads may be recreated by the next parallel region


def release_cpu_threads() -> bool:
    """This thread's OpenMP worker threads back to the system, before it waits (an idle engine, a
    trainer waiting for its groups, the weight-sync agent after a push); its next parallel torch
    op starts them again (a fraction of a millisecond). Why: GNU OpenMP counts every worker
    thread of every thread's team, idle or not, and once they outnumber the cores it stops
    spinning between parallel regions, so each small op of a decode step pays a futex wake-up.
    On 2 cores one idle team beside the engine's took a SmolLM2 decode step of 32 rows from
    173 to 239-300 ms, and the in-process trainer's step from 7.4 to 5.7 s once both released.
    Uses OpenMP 5.0's documented omp_pause_resource_all on the runtime torch loaded, and only
    GNU's (libgomp: it frees the calling thread's pool and nothing else); elsewhere a no-op.
    Returns whether the pool was released."""
    pause = _omp_pause()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0


@functools.lru_cache(maxsize=None)
def _omp_pause():
    import ctypes

    import torch

    if not torch.backends.openmp.is_available():  # importing torch loaded the runtime it was built with
        return None
    try:
        lib = ctypes.CDLL(None)
        pause = lib.omp_pause_resource_all
        lib.GOMP_parallel  # noqa: B018 - GNU's runtime: its pause frees the calling thread's pool only
    except (OSError, AttributeError):
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause
