"""The ported plug-in examples, each run end to end through `grpojob run` on the tiny model, and
each checked for its custom part in metrics.jsonl (not merely that the run finished)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpojob.local.progress import read_records

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
pytestmark = pytest.mark.slow


def run_example(manifest: Path, run_dir: Path, model: Path, *sets: str) -> list[dict]:
    """`grpojob run` from the repository root (the examples' code.localPath is relative to it)."""
    argv = [sys.executable, "-m", "grpojob", "run", str(manifest), "--run-dir", str(run_dir), "--no-progress",
            "--set", f"model.path={model}", "--set", "training.steps=3", "--set", "checkpoint.everySteps=100"]
    for s in sets:
        argv += ["--set", s]
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3], proc.stdout
    return records


def test_cosmos_custom_trainer_dataset_class_and_rollout_engine(tmp_path, tiny_dir):
    records = run_example(EXAMPLES / "cosmos" / "cosmos.yaml", tmp_path / "run", tiny_dir)
    for r in records:
        # The custom loss_fn: GRPO's loss minus the entropy bonus, both reported by the loss itself.
        pg, bonus = r["extra"]["pg_loss"], r["extra"]["entropy_bonus"]
        assert bonus > 0.01 and r["loss"] == pytest.approx(pg - bonus, rel=1e-4, abs=1e-7)
        # the reward's (value, dict): the value is the reward, the dict's part is reported beside it
        assert r["rewards"].keys() == {"category_reward", "category_reward/words"}
        assert 1 <= r["rewards"]["category_reward/words"] <= 4  # maxTokens 4: at most 4 words
    # The dataset class: its 24 rows, one epoch over 3 steps of 8 prompts; its reference answers
    # reached the cosmos-rl reward as `reference`, and the completions as `to_be_evaluated` (a missing
    # answer scores 0 every time, and so does the prompt, which holds no word of its category).
    assert sorted(i for r in records for i in r["sample_ids"]) == list(range(24))
    assert max(r["reward_mean"] for r in records) > 0
    # The engine: it generated, and it received each pushed version through the weight sync.
    log = (tmp_path / "run" / "logs" / "rollout-0.log").read_text()
    assert "example-hf engine: now serving policy version 2" in log
    assert [r["rollouts"][0]["version"] for r in records] == [1, 2, 3]  # the last step pushes too


def test_nexrl_trainer_folds_a_kl_penalty_into_token_level_rewards(tmp_path, tiny_dir):
    records = run_example(EXAMPLES / "nexrl" / "nexrl.yaml", tmp_path / "run", tiny_dir)
    first, *later = records
    assert abs(first["extra"]["kl_in_reward"]) < 1e-4  # step 1 samples from the reference policy itself
    assert max(r["extra"]["kl_in_reward"] for r in later) > 1e-3  # the policy moved: the penalty bites
    for r in records:
        # returns are the rewards less the KL penalty, summed over the tokens of each completion
        assert r["extra"]["return_mean"] + r["extra"]["kl_penalty_mean"] == pytest.approx(r["reward_mean"], abs=1e-6)
        assert r["extra"]["token_reward"] != 0  # the per-token field reached loss_fn
        assert r["kl"] is None  # no KL term in the loss: it is in the reward


def test_areal_remax_workflow_uses_the_greedy_reward_as_baseline(tmp_path, tiny_dir):
    records = run_example(EXAMPLES / "areal" / "areal.yaml", tmp_path / "run", tiny_dir)
    # With GRPO's group-mean baseline and no normalisation the advantages of a step average exactly
    # 0; with ReMax's greedy baseline they average reward_mean - (mean greedy reward).
    assert any(abs(r["advantage_mean"]) > 1e-3 for r in records)
    assert all(r["reward_mean"] - r["advantage_mean"] >= -1e-9 for r in records)  # greedy rewards are >= 0
