"""The processes of a `grpojob run` share this machine's cores: their OpenMP threads wait passively
(plan.THREAD_ENV; on 2 cores two CPU rollout servers with spinning threads generated a step 16x
slower than one), unless the caller's environment says otherwise."""
from __future__ import annotations

import io

from grpojob.local import runner
from grpojob.local.restarts import RestartPolicy
from tests.helpers.jobs import job_from


def children_env(tmp_path) -> dict[str, dict[str, str]]:
    job = job_from({"model": {}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}],
                    "rollout": {"replicas": 2}, "checkpoint": {"path": str(tmp_path / "ckpt")}}, tmp_path / "model")
    run = runner.Run(job, tmp_path, None, progress=False, out=io.StringIO(), restarts=RestartPolicy())
    return {c.name: c.env for c in run.children}


def test_every_process_of_a_run_waits_passively(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    envs = children_env(tmp_path)
    assert set(envs) == {"trainer-0", "rollout-0", "rollout-1"}
    assert {name: env["OMP_WAIT_POLICY"] for name, env in envs.items()} == dict.fromkeys(envs, "PASSIVE")


def test_the_callers_own_wait_policy_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert {env["OMP_WAIT_POLICY"] for env in children_env(tmp_path).values()} == {"ACTIVE"}
