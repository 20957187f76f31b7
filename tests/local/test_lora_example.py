"""examples/tiny-lora.yaml, as a user runs it: `grpojob run` builds the LoRA-ready tiny model
(grpojob.io/build-tiny-model: "lora"), trains only the adapter, pushes only the adapter, and the
reward rises (issue 34: the README's LoRA line on the plain tiny model gained 0.015)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from grpojob.local.progress import read_records

from .test_run import ROOT, processes_of, workdir  # noqa: F401 - workdir is a fixture

pytestmark = pytest.mark.slow


def test_the_lora_example_learns(workdir):
    run_dir = workdir / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(ROOT / "examples" / "tiny-lora.yaml"),
                           "--run-dir", str(run_dir), "--no-progress"], cwd=workdir, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "building a tiny random model" in out and (workdir / ".cache" / "tiny-lora-model" / "config.json").exists()
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 61))
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-10:]) / 10
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
    pushes = [r for r in records if r["published"]]
    assert pushes and all(r["sync_tensors"] == 28 for r in pushes)  # 2 layers x 7 linear layers x (A, B)
    assert (run_dir / "final-model" / "adapter_config.json").exists()
    assert processes_of(run_dir) == []
