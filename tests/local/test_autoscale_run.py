"""spec.rollout.autoscale in a real `grpojob run` (the tiny model built on the fly).

examples/autoscale.yaml: generation is the slow part of a synchronous step, so the trainer waits
for groups over the target, the local scaler starts a second rollout server, and that server joins
the weight-sync group and serves the current policy version while the run goes on. (Whether the
steps then get faster depends on free cores: on a 2-core machine a second CPU engine competes with
the first, and the scale-up is undone, ScaleUpNoGain: benchmarks/autoscale.py's cpu part. Here
scaleUp.minGain -1 keeps it, whatever the machine.)

examples/plugins/paced/autoscale-paced.yaml: the paced engine (each completion holds its server
for a set time, one request at a time, as a busy accelerator; no CPU burnt) makes generation slow
for the first policy versions, then fast. The scaler scales up while it is slow, and back down
once it is fast; the servers it stops drain (finish what they have), so every step trains on the
full promptsPerStep and the run succeeds. (Speed is benchmarks/autoscale.py's business; whether a
scale-up pays depends on the machine's free cores, so scaleUp.minGain -1 keeps every one here: the
trial's cases are tests/api/test_autoscale.py's and tests/local/test_autoscaler.py's.)"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from grpojob.local.autoscaler import DECISIONS_FILE
from grpojob.local.progress import read_records

from .test_run import ROOT, workdir  # noqa: F401 - the fixture that kills what is left

EXAMPLE = ROOT / "examples" / "autoscale.yaml"
PACED = ROOT / "examples" / "plugins" / "paced"
PACED_EXAMPLE = PACED / "autoscale-paced.yaml"
FAST_FROM = 6  # the policy version from which the paced example's generation is fast (its engineArgs.pace)
pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone


def grpojob_run(run_dir, *sets: str, cwd, example=EXAMPLE) -> subprocess.Popen:
    argv = [sys.executable, "-m", "grpojob", "run", str(example), "--run-dir", str(run_dir), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_a_slow_generation_scales_rollout_processes_up(workdir):  # noqa: F811
    run_dir = workdir / "run"
    # the example's 40 steps: the scale-up comes once 3 step times are measured (step 4), and the new
    # server joins about 8 s later (its start-up beside the running job: 15-20 steps here)
    proc = grpojob_run(run_dir, "rollout.autoscale.maxReplicas=2",
                       "rollout.autoscale.targetWaitFraction=0.2", "rollout.autoscale.scaleUp.steps=1",
                       "rollout.autoscale.scaleUp.cooldownSeconds=0", "rollout.autoscale.scaleUp.minGain=-1",
                       cwd=workdir)
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
    # a server that registers between a step's push and that step's record shows its load-time
    # version once; the catch-up (or the next step's push at the latest) brings it level
    lags = [[s["lag"] for s in r["rollouts"]] for r in joined]
    assert all(lag == 0 for step in lags[1:] for lag in step), lags
    assert joined[-1]["step"] == 40
    assert (run_dir / "logs" / "rollout-1.log").exists()


def test_slow_then_fast_generation_scales_up_then_back_down_and_loses_no_group(workdir):  # noqa: F811
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, f"code.localPath={PACED}", "training.steps=16", "rollout.autoscale.maxReplicas=2",
                       "rollout.autoscale.scaleDown.steps=1", "rollout.autoscale.scaleUp.minGain=-1", cwd=workdir,
                       example=PACED_EXAMPLE)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    decisions = [json.loads(line) for line in (run_dir / DECISIONS_FILE).read_text().splitlines()]
    up = decisions[0]  # generation is slow from the start: the first change adds servers
    assert (up["reason"], up["replicas"], up["started"]) == ("ScaleUp", 2, ["rollout-1"]), decisions
    assert up["step"] <= FAST_FROM, decisions
    assert all(1 <= d["replicas"] <= 2 for d in decisions), decisions  # within minReplicas..maxReplicas
    # once generation is fast (groups of policy version FAST_FROM on), the servers idle: one is stopped
    down = [d for d in decisions if d["reason"] == "ScaleDown" and d["step"] > FAST_FROM]
    assert down and down[0]["replicas"] == 1 and len(down[0]["stopped"]) == 1, decisions
    assert "autoscale: ScaleDown: 2 -> 1 rollout servers: rollout servers idle over 30% of the step" in out
    # no group lost: every step trained on the full promptsPerStep, every group complete
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 17))
    assert all((r["groups"], r["groups_kept"], r["completions"]) == (8, 8, 32) for r in records), records
    # each stopped server drained (what it had in flight finished there, nothing was cut off) and left
    # the weight-sync group, so no push waited for its heartbeats to run out. (On a loaded machine a
    # server may still be starting when the fast part stops it: it never joined, and had nothing.)
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    for d in decisions:
        for name in d["stopped"]:
            if not any(s["replica"] == name for r in records for s in r["rollouts"]):
                assert f"'{name}'" not in trainer_log, "a server that never joined was heard of"
                continue
            log = (run_dir / "logs" / f"{name}.log").read_text()
            assert "nothing in flight to drain" in log or re.search(r"requests finished \(\d+ completion "
                                                                    r"tokens\), 0 cut off", log), log[-2000:]
            assert f"'{name}'" in trainer_log and "left the weight-sync group" in trainer_log
    assert "sent no heartbeat" not in trainer_log
    assert "done: 16 steps" in out
