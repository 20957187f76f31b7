"""spec.judges under `grpojob run`: a free port per judge server, the trainer's addresses of them,
and their model paths relative to where the run starts (as spec.model.path is)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grpojob.api import GRPOJob
from grpojob.local.processes import free_port

HOST = "127.0.0.1"


def ports(job: GRPOJob) -> dict[str, list[int]]:
    """Judge name -> a free port per replica (the replicas share this host)."""
    return {j.name: [free_port() for _ in range(j.replicas)] for j in job.spec.judges}


def urls(taken: dict[str, list[int]]) -> dict[str, tuple[str, ...]]:
    return {name: tuple(f"http://{HOST}:{p}" for p in ps) for name, ps in taken.items()}


def resolve_paths(spec: dict[str, Any]) -> None:
    for j in spec.get("judges") or ():
        if isinstance(j, dict) and isinstance(j.get("model"), str):
            j["model"] = str(Path(j["model"]).expanduser().resolve())
