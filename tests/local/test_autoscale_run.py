"""spec.rollout.autoscale in a real `grpojob run` (examples/autoscale.yaml, the tiny model built on the
fly): generation is the slow part of a synchronous step, so the trainer waits for groups over the
target, the local scaler starts a second rollout server, and that server joins the weight-sync
group and serves the current policy version while the run goes on. (Whether the wait share then
falls depends on free cores: on a 2-core machine a second CPU engine competes with the first.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpojob.local.autoscaler import DECISIONS_FILE
from grpojob.local.progress import read_records

from .test_run import ROOT, workdir  # noqa: F401 - the fixture that kills what is left

EXAMPLE = ROOT / "examples" / "autoscale.yaml"
pytestmark = pytest.mark.slow


def grpojob_run(run_dir, *sets: str, cwd) -> subprocess.Popen:
    argv = [sys.executable, "-m", "grpojob", "run", str(EXAMPLE), "--run-dir", str(run_dir), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_a_slow_generation_scales_rollout_processes_up(workdir):  # noqa: F811
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=14", "rollout.autoscale.maxReplicas=2",
                       "rollout.autoscale.targetWaitFraction=0.2", "rollout.autoscale.scaleUp.steps=1",
                       "rollout.autoscale.scaleUp.cooldownSeconds=0", cwd=workdir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    decisions = [json.loads(line) for line in (run_dir / DECISIONS_FILE).read_text().splitlines()]
    up = decisions[0]
    assert (up["reason"], up["replicas"], up["started"]) == ("ScaleUp", 2, ["rollout-1"]), decisions
    assert "autoscale: ScaleUp: 1 -> 2 rollout servers" in out
    records = read_records(run_dir / "metrics.jsonl")
    assert records[up["step"] - 1]["wait_fraction"] > 0.2  # the signal it acted on
    # the new server joined the weight-sync group at the trainer's version and stayed in it
    joined = [r for r in records if any(s["replica"] == "rollout-1" for s in r["rollouts"])]
    assert joined, "rollout-1 never joined the weight-sync group"
    assert all(s["lag"] == 0 for r in joined for s in r["rollouts"])
    assert joined[-1]["step"] == 14
    assert (run_dir / "logs" / "rollout-1.log").exists()
