"""Issue 35's Done-when, locally: examples/tiny-judge.yaml as a user runs it. `grpojob run` trains
the toy task's tiny reward model (a sequence classifier that prefers the category words,
grpojob.judge.tiny), serves it as the job's judge process, and the policy learns from the judge's
scores alone: the job names no rule-based reward."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grpojob.api import load_manifest
from grpojob.local.progress import read_records

from ..local.test_run import processes_of

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-judge.yaml"
GENERATIVE = ROOT / "examples" / "tiny-generative-judge.yaml"
pytestmark = pytest.mark.slow


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    for pid in processes_of(tmp_path / "run"):
        os.kill(pid, signal.SIGKILL)


def run_example(example, workdir, steps: int) -> tuple[str, list[dict], float, float]:
    """`grpojob run example` as a user runs it: its output, step records, and the mean reward of
    the first and of the last 3 steps (every step recorded)."""
    run_dir = workdir / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(example), "--run-dir", str(run_dir),
                           "--no-progress"], cwd=workdir, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}: {[round(r, 3) for r in rewards]}"
    return out, records, first, last


def test_a_reward_model_served_by_the_job_drives_learning(workdir):
    spec = load_manifest(str(EXAMPLE), [])["spec"]
    assert [r.get("judge") for r in spec["rewards"]] == ["words"] and not any(r.get("name") for r in spec["rewards"])
    out, records, first, last = run_example(EXAMPLE, workdir, 40)
    print(f"judge reward: steps 1-3 {first:.3f} -> steps 38-40 {last:.3f}")
    assert "training the toy task's tiny reward model" in out
    run_dir = workdir / "run"
    assert set(records[-1]["rewards"]) == {"words"}  # the judge's score, no other reward
    assert "judge-words-0" in (run_dir / "logs" / "judge-words-0.log").read_text()
    assert processes_of(run_dir) == []


def test_a_generative_judge_served_by_the_job_drives_learning(workdir):
    """examples/tiny-generative-judge.yaml: the tiny chat judge (taught its rubric when missing)
    answers in words, score.pattern reads the reward, and the policy learns from that alone."""
    out, records, first, last = run_example(GENERATIVE, workdir, 30)
    print(f"generative judge reward: steps 1-3 {first:.3f} -> steps 28-30 {last:.3f}")
    assert "training the toy task's tiny chat judge" in out
    run_dir = workdir / "run"
    assert set(records[-1]["rewards"]) == {"rubric"}  # the score read from the judge's answers, no other reward
    assert processes_of(run_dir) == []


def test_a_missing_judge_model_is_refused_with_its_field_path(workdir):
    job = workdir / "job.yaml"
    job.write_text(EXAMPLE.read_text().replace('    grpojob.io/build-tiny-reward-model: "true"   # the judge\'s model\n', ""))
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(job), "--run-dir", str(workdir / "run"),
                           "--no-progress"], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "spec.judges[0].model" in proc.stderr and "has no model" in proc.stderr, proc.stderr
