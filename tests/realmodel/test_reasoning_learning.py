"""A real pretrained model learns a real task, in CI: SmolLM2-135M-Instruct on reasoning-gym's
chain_sum, its reward the task's own score_answer; the training reward and the held-out score (a split
of questions never trained on) both rise within a few CPU minutes. The model: conftest.py's smollm2_dir."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed in this set")

from grpojob.leader.build import build  # noqa: E402

from ..helpers.jobs import job_from  # noqa: E402

TASK = {"tasks": [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                   "max_digits": 2}}],
        "seed": 1, "system_prompt": "direct", "prefill": True}
STEPS = 10


@pytest.mark.slow
def test_smollm2_learns_chain_sum(smollm2_dir, tmp_path):
    """The model opens with " 7 + 9 = 16" (partial credit, cut at 8 tokens): within 10 steps it learns
    to answer shorter (" = 16"). Measured on 2 shared cores: reward 0.05 -> 0.22 (first and last 3
    steps), held-out score 0.04 -> 0.23; 55-120 s (6.5 min beside another training run)."""
    job = job_from({
        "model": {"path": None, "useChatTemplate": True},
        "dataset": {"factory": "reasoning-gym", "args": {**TASK, "size": 500}, "maxPromptLength": 128},
        "rewards": [{"name": "reasoning-gym"}],
        "evaluation": {"dataset": {"factory": "reasoning-gym", "args": {**TASK, "size": 16, "split": "test"},
                                   "maxPromptLength": 128},
                       "everySteps": STEPS, "atStart": True},
        "algorithm": {"name": "grpo", "groupSize": 16},
        "training": {"steps": STEPS, "promptsPerStep": 4, "learningRate": 2e-5, "microBatchTokens": 2048},
        "rollout": {"backend": "hf", "sampling": {"maxTokens": 8}},
        "checkpoint": {"path": "checkpoints", "everySteps": 100},
    }, smollm2_dir)
    records = []
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"),
                on_step=lambda r: records.append(r.to_json()))
    run.run()
    evals = _evaluations(tmp_path / "run")
    first, last = [r["reward_mean"] for r in records[:3]], [r["reward_mean"] for r in records[-3:]]
    assert sum(last) / 3 > sum(first) / 3 + 0.1, f"reward {first} -> {last}"
    assert [e["step"] for e in evals] == [0, STEPS]
    score = [e["rewards"]["reasoning-gym"] for e in evals]
    assert score[1] > score[0] + 0.1, f"held-out score {score}"


def _evaluations(run_dir: Path) -> list[dict]:
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "evaluation"]
