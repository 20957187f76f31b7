"""Where each end of a weight push computes, and which path the push takes between them.

An endpoint is a process that holds weights: trainer rank 0 (the sender), an hf rollout server, or
one vLLM worker. It is described by its device kind and, on a GPU, the GPU's UUID: the same
physical GPU has the same UUID in every process, whatever CUDA_VISIBLE_DEVICES renumbers. A
rollout server also reports whether it shares memory with the trainer: whether it could read the
probe file the publisher wrote under /dev/shm (the same host and the same IPC namespace, as in
`grpojob run`; two pods never do, even on one node).

The path for one (trainer, endpoint) pair, `route()`:

| weightSync.backend | same GPU, shared memory | same GPU, not shared | different GPUs | CPU on either side |
|---|---|---|---|---|
| auto     | cuda-ipc | gloo    | nccl    | gloo |
| nccl     | refused  | refused | nccl    | refused |
| cuda-ipc | cuda-ipc | refused | refused | refused |
| shm      | shm (needs shared memory, any devices) ||||
| gloo     | gloo everywhere ||||

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so `auto` never picks it for one
GPU; CUDA IPC maps the trainer's GPU buffers in the receiver (no copy through the host); gloo
works everywhere (GPU weights are staged through host memory). `checkpoint` goes through files.
"""
from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from grpojob import devices

BACKEND_FIELD = "spec.weightSync.backend"
PATHS = ("nccl", "cuda-ipc", "shm", "gloo", "checkpoint")
COLLECTIVES = ("nccl", "gloo")  # paths that form a process group; the others hand buffers over
SHM_DIR = Path("/dev/shm")


class PlacementError(ValueError):
    """An explicit weightSync.backend that cannot work between these endpoints."""


@dataclass(frozen=True)
class Endpoint:
    device: str  # "cpu" or "cuda"
    gpu: Optional[str] = None  # the GPU's UUID
    host: str = ""

    def __str__(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu else "CPU"
        return f"{where} on {self.host}" if self.host else where

    def to_json(self) -> dict:
        return {"device": self.device, "gpu": self.gpu, "host": self.host}

    @classmethod
    def from_json(cls, doc: dict) -> "Endpoint":
        device = doc.get("device")
        if device not in ("cpu", "cuda") or (device == "cuda" and not doc.get("gpu")):
            raise ValueError(f"not an endpoint description: {doc!r}")
        return cls(device, doc.get("gpu") if device == "cuda" else None, str(doc.get("host", "")))


def local(device) -> Endpoint:
    """This process's endpoint computing on `device` (a torch.device or its name)."""
    import torch

    device = torch.device(device)
    host = socket.gethostname()
    if device.type != "cuda":
        return Endpoint("cpu", None, host)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return Endpoint("cuda", str(torch.cuda.get_device_properties(index).uuid), host)


def route(backend: str, trainer: Endpoint, server: Endpoint, shares_memory: bool) -> str:
    """The path of a push from `trainer` to `server`; PlacementError for an impossible explicit choice."""
    same_gpu = trainer.gpu is not None and trainer.gpu == server.gpu
    both_gpu = trainer.gpu is not None and server.gpu is not None
    if backend == "auto":
        if same_gpu:
            return "cuda-ipc" if shares_memory else "gloo"
        return "nccl" if both_gpu else "gloo"
    if backend in ("gloo", "checkpoint"):
        return backend
    if backend == "nccl":
        if not both_gpu:
            side = "the trainer" if trainer.gpu is None else "this endpoint"
            raise PlacementError(f"nccl needs a GPU at both ends, and {side} computes on the CPU; "
                                 f"use auto or gloo")
        if same_gpu:
            raise PlacementError(f"nccl cannot connect two processes on one GPU ({server.gpu}); "
                                 f"use auto (CUDA IPC) or cuda-ipc")
        return "nccl"
    if backend == "cuda-ipc":
        if not same_gpu:
            raise PlacementError(f"cuda-ipc needs the endpoint on the trainer's GPU ({trainer}), "
                                 f"and it computes on {server}; use auto")
        if not shares_memory:
            raise PlacementError(f"cuda-ipc needs the trainer's host and IPC namespace, and {server} "
                                 f"cannot read the trainer's /dev/shm; use auto")
        return "cuda-ipc"
    if backend == "shm":
        if not shares_memory:
            raise PlacementError(f"shm needs the trainer's host and IPC namespace, and {server} "
                                 f"cannot read the trainer's /dev/shm; use auto or gloo")
        return "shm"
    raise PlacementError(f"unknown weight-sync backend '{backend}'")


def colocated_route(backend: str, trainer: Endpoint, server: Endpoint, shares_memory: bool) -> str:
    """spec.placement colocated: the engine shares the trainer's host and memory, and its push
    makes no network copy. auto: CUDA IPC on the trainer's GPU, shared memory otherwise; shm and
    cuda-ipc as `route` decides; anything else (nccl, gloo, checkpoint) is refused."""
    if not shares_memory:
        raise PlacementError(f"placement colocated needs the engine in the trainer's pod (its /dev/shm), and "
                             f"{server} cannot read the trainer's /dev/shm")
    if backend == "auto":
        return "cuda-ipc" if trainer.gpu is not None and trainer.gpu == server.gpu else "shm"
    if backend not in ("shm", "cuda-ipc"):
        raise PlacementError(f"{BACKEND_FIELD}: {backend} copies the weights over the network or through files, and placement colocated hands the "
                             f"weights over in memory: use auto, shm or cuda-ipc")
    return route(backend, trainer, server, shares_memory)


def check_trainer(backend: str, trainer: Endpoint) -> None:
    """Refuse, before the store opens, a backend the trainer's own device rules out."""
    if backend in ("nccl", "cuda-ipc") and trainer.gpu is None:
        raise PlacementError(f"{BACKEND_FIELD}: {backend} needs the trainer on a GPU, and it computes "
                             f"on the CPU; use auto or gloo")


def check_local_run(backend: str, gpus: int) -> Optional[str]:
    """Why `backend` cannot work in `grpojob run` on a machine with `gpus` GPUs (None if it can).
    Locally every process shares the host, and a rollout server computes on the first GPU, which
    is trainer rank 0's."""
    if backend == "nccl" and gpus:
        return ("nccl cannot connect two processes on one GPU, and locally the rollout servers share "
                "trainer rank 0's GPU; use auto (CUDA IPC)")
    if backend == "nccl":
        return "nccl needs GPUs, and this machine has none; use auto"
    if backend == "cuda-ipc" and not gpus:
        return "cuda-ipc needs a GPU, and this machine has none; use auto"
    return None


def visible_gpus() -> int:
    """GPUs this machine's processes compute on (0 where GRPOJOB_DEVICE pins the CPU)."""
    try:
        if devices.requested() == "cpu":
            return 0
    except devices.DeviceError:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---- the shared-memory probe -----------------------------------------------------------------
def write_probe(run: str) -> Optional[dict]:
    """A file only processes that share our /dev/shm can read; None where there is no /dev/shm."""
    if not SHM_DIR.is_dir():
        return None
    path = SHM_DIR / f"grpojob-{run}.probe"
    token = secrets.token_hex(16)
    try:
        path.write_text(token)
    except OSError:
        return None
    return {"path": str(path), "token": token}


def remove_probe(probe: Optional[dict]) -> None:
    if probe:
        Path(probe["path"]).unlink(missing_ok=True)


def shares_memory(probe: Optional[dict]) -> bool:
    """True when this process reads the publisher's probe (same host, same IPC namespace)."""
    if not probe:
        return False
    try:
        return Path(probe["path"]).read_text() == probe["token"]
    except OSError:
        return False


def describe(paths: dict[str, list[str]]) -> str:
    """'cuda-ipc' or 'nccl (2), cuda-ipc (1)': the paths of a push and how many servers took each."""
    if len(paths) == 1:
        return next(iter(paths))
    return ", ".join(f"{p} ({len(who)})" for p, who in sorted(paths.items()))
