"""`grpojob run` with an environment (Atropos style): the example arithmetic environment runs as its
own process, asks the rollout server over the OpenAI endpoint, scores the answers itself and
pushes groups to the trainer's trajectory API; the trainer (rollout.workflow none) learns from
them alone, and metrics.jsonl carries the environment's own rewards."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from grpojob.local.progress import read_records

from .test_run import ROOT, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "environments" / "arithmetic.yaml"


def test_the_trainer_learns_from_an_environment_process(workdir):  # noqa: F811
    doc = yaml.safe_load(EXAMPLE.read_text())
    # The example's command is relative to the repository root; this run starts elsewhere.
    doc["spec"]["environments"][0]["command"] = [sys.executable, str(ROOT / "examples/environments/arithmetic.py")]
    steps, pps = 30, doc["spec"]["training"]["promptsPerStep"]
    # beside it, one that drives its own loop and writes its results after the last step (ART's script)
    results = workdir / "results.txt"
    doc["spec"]["environments"].append({"name": "driver", "command": [
        sys.executable, str(ROOT / "tests/local/driver_env.py"), str(steps), str(results)]})
    manifest = workdir / "arithmetic.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    run_dir = workdir / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(manifest), "--run-dir", str(run_dir),
                           "--no-progress", "--set", f"training.steps={steps}"],
                          cwd=workdir, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "environment arithmetic x 1" in out and f"done: {steps} steps" in out

    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every group is the environment's, scored by it
        assert r["groups_from_environments"] == pps and r["groups"] == pps and r["sample_ids"] == []
        assert set(r["rewards"]) == {"number", "correct"} and r["environments"]["arithmetic"]["groups"] == pps
        assert r["reward_mean"] == pytest.approx(r["rewards"]["number"] + r["rewards"]["correct"])
        assert r["rollout_idle_fraction"] is None
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
    assert max(r["policy_staleness_max"] for r in records) <= 1  # algorithm.maxStaleness

    env_log = [json.loads(x) for x in (run_dir / "logs" / "env-arithmetic-0.log").read_text().splitlines()
               if x.startswith("{")]
    registered = next(e for e in env_log if e["event"] == "registered")
    assert registered["group_size"] == doc["spec"]["algorithm"]["groupSize"]
    assert sum(e["groups"] for e in env_log if e["event"] == "submitted") >= steps * pps
    endpoints = json.loads((run_dir / "endpoints.json").read_text())
    assert endpoints["trajectories"] == endpoints["trainer-0"] + "/trajectories"
    assert processes_of(run_dir) == []
    # the driver's tail ran: the end of training waited for it, and stopped the arithmetic server
    assert results.read_text() == f"done after step {steps}\n", (run_dir / "logs" / "env-driver-0.log").read_text()
