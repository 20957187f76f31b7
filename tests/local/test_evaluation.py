"""`grpojob run examples/tiny-evaluation.yaml` (docs/evaluation.md): the held-out prompts are generated
on the real rollout server between weight pushes, and the tiny model's evaluation reward rises as it
learns."""
from __future__ import annotations

import subprocess
import sys

import pytest

from grpojob.local.progress import read_evaluations, read_records

from .test_run import ROOT, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "tiny-evaluation.yaml"


def test_evaluation_reward_rises_over_a_short_run(workdir):  # noqa: F811
    run_dir = workdir / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(EXAMPLE), "--run-dir", str(run_dir),
                           "--no-progress", "--set", "training.steps=40"], cwd=workdir, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    metrics = run_dir / "metrics.jsonl"
    assert [r["step"] for r in read_records(metrics)] == list(range(1, 41))
    evals = read_evaluations(metrics)
    # the initial policy, every 20 steps, and the last step's (once)
    assert [(e["step"], e["policy_version"], e["prompts"], e["greedy"]) for e in evals] == [
        (0, 0, 24, True), (20, 20, 24, True), (40, 40, 24, True)]
    first, last = evals[0]["reward_mean"], evals[-1]["reward_mean"]
    assert last >= first + 0.3, f"evaluation reward {first:.3f} -> {last:.3f}"
    assert evals[-1]["pass_at"]["1"] >= evals[0]["pass_at"]["1"]
    assert f"evaluation reward {first:.3f} (step 0) -> {last:.3f} (step 40)" in out
    assert (run_dir / "reward.png").stat().st_size > 1000
    assert processes_of(run_dir) == []
