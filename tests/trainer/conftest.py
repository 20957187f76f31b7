import pytest

from tests.helpers.jobs import job_from

from .procs import Proc


BASE = {
    "model": {"path": None},
    "dataset": {"factory": "toy", "maxPromptLength": 32},
    "rewards": [{"name": "toy"}],
    "algorithm": {"name": "grpo", "groupSize": 8},
    "training": {"steps": 4, "promptsPerStep": 8, "learningRate": 3e-3, "microBatchTokens": 256},
    "rollout": {"backend": "hf", "sampling": {"maxTokens": 4}},
    "checkpoint": {"path": "checkpoints", "everySteps": 100, "keepLast": 2},
}


def make_job(model_dir, **over):
    """A GRPOJob for the toy task on the tiny model; keyword overrides merge into the spec."""
    return job_from(BASE, model_dir, **over)


@pytest.fixture
def procs():
    """procs(cmd, env, log_path) -> Proc; every one is killed (with its tree) at teardown."""
    started: list[Proc] = []
    yield lambda *a: started.append(Proc(*a)) or started[-1]
    for p in started:
        p.kill()
