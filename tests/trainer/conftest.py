import copy
from pathlib import Path

import pytest

from grpojob.api import parse

from .procs import Proc


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return build(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return build(tmp_path_factory.mktemp("models") / "tiny-tied", tie_embeddings=True)


BASE = {
    "model": {"path": None},
    "dataset": {"factory": "toy", "maxPromptLength": 32},
    "rewards": [{"name": "toy"}],
    "algorithm": {"name": "grpo", "groupSize": 8},
    "training": {"steps": 4, "promptsPerStep": 8, "learningRate": 3e-3, "microBatchTokens": 256},
    "rollout": {"backend": "hf", "sampling": {"maxTokens": 4}},
    "checkpoint": {"path": "checkpoints", "everySteps": 100, "keepLast": 2},
}


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_job(model_dir, **over):
    """A GRPOJob for the toy task on the tiny model; keyword overrides merge into the spec."""
    spec = _merge(BASE, over)
    spec["model"]["path"] = str(model_dir)
    return parse({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "t"}, "spec": spec})


@pytest.fixture
def procs():
    """procs(cmd, env, log_path) -> Proc; every one is killed (with its tree) at teardown."""
    started: list[Proc] = []
    yield lambda *a: started.append(Proc(*a)) or started[-1]
    for p in started:
        p.kill()
