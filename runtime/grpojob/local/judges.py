"""spec.judges under `grpojob run`: a free port per judge server, the trainer's addresses of them,
and their model paths relative to where the run starts (as spec.model.path is)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grpojob.api import FieldError, GRPOJob, InvalidSpec
from grpojob.local.processes import free_port

HOST = "127.0.0.1"
BUILD_TINY_REWARD_MODEL = "grpojob.io/build-tiny-reward-model"  # annotation: build a missing judge model


def ports(job: GRPOJob) -> dict[str, list[int]]:
    """Judge name -> a free port per replica (the replicas share this host)."""
    return {j.name: [free_port() for _ in range(j.replicas)] for j in job.spec.judges}


def urls(taken: dict[str, list[int]]) -> dict[str, tuple[str, ...]]:
    return {name: tuple(f"http://{HOST}:{p}" for p in ps) for name, ps in taken.items()}


def resolve_paths(spec: dict[str, Any]) -> None:
    for j in spec.get("judges") or ():
        if isinstance(j, dict) and isinstance(j.get("model"), str):
            j["model"] = str(Path(j["model"]).expanduser().resolve())


def ensure_models(job: GRPOJob, out) -> None:
    """Every judge's model must be there; with the annotation BUILD_TINY_REWARD_MODEL a missing one is
    built (grpojob.judge.tiny: the toy task's reward model, trained here in about a minute; for a
    generative judge, the tiny chat model taught the rubric there)."""
    annotations = (job.metadata.model_extra or {}).get("annotations") or {}
    build = str(annotations.get(BUILD_TINY_REWARD_MODEL, "")).lower() == "true"
    for i, j in enumerate(job.spec.judges):
        if (Path(j.model) / "config.json").exists():
            continue
        if not build:
            raise InvalidSpec([FieldError(f"spec.judges[{i}].model", f"'{j.model}' has no model (config.json); set "
                                          f"annotation {BUILD_TINY_REWARD_MODEL}: \"true\" to build the toy task's "
                                          "tiny reward model there")])
        from grpojob import tiny_cache
        from grpojob.judge.tiny import build as build_reward_model, build_generative

        what = "tiny chat judge (its rubric: grpojob.judge.tiny)" if j.kind == "generative" else "tiny reward model"
        print(f"judge {j.name}: model {j.model} not found: training the toy task's {what} there "
              f"(annotation {BUILD_TINY_REWARD_MODEL})", file=out)
        tiny_cache.build(build_generative if j.kind == "generative" else build_reward_model, j.model)
