"""The evaluation inside the training loop (the trainer with its in-process engine, the same
manager, pipeline and loop as with rollout servers): which steps evaluate, on which policy, what it
costs the training steps, and that its prompts stay out of the training stream."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from grpojob.data import PromptSettings, PromptStream
from grpojob.local.progress import read_evaluations, read_records
from grpojob.leader.build import build
from tests.trainer.conftest import make_job

HELD_OUT = {"factory": "toy", "args": {"size": 12, "seed": 1}, "maxPromptLength": 32}


class Spy:
    """The evaluator's generator, recording each call's version floor and the versions it got."""

    def __init__(self, generator):
        self.generator, self.calls = generator, []

    async def generate(self, prompt_ids, n, sampling, *, min_version=None):
        out = await self.generator.generate(prompt_ids, n, sampling, min_version=min_version)
        self.calls.append((min_version, n, sampling.temperature, {c.policy_version for c in out}))
        return out


def test_evaluations_follow_the_schedule_on_the_pushed_policy(tiny_dir, tmp_path):
    job = make_job(tiny_dir, training={"steps": 5, "promptsPerStep": 4, "microBatchTokens": 256},
                   evaluation={"dataset": HELD_OUT, "everySteps": 2, "atStart": True, "samplesPerPrompt": 3,
                               "sampling": {"maxTokens": 4}, "maxPrompts": 5})
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path))
    spy = run.rollouts.evaluation.evaluator.generator = Spy(run.rollouts.evaluation.evaluator.generator)
    assert run.run() == "completed"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # each evaluation is reported before the next step's record; the last step's after it
    assert [(r.get("kind") or "step", r["step"]) for r in rows] == [
        ("evaluation", 0), ("step", 1), ("step", 2), ("evaluation", 2), ("step", 3), ("step", 4),
        ("evaluation", 4), ("step", 5), ("evaluation", 5)]
    evals, steps = read_evaluations(tmp_path / "metrics.jsonl"), read_records(tmp_path / "metrics.jsonl")
    assert [e["policy_version"] for e in evals] == [0, 2, 4, 5]
    for e in evals:
        assert e["prompts"] == 5 and e["samples_per_prompt"] == 3 and set(e["pass_at"]) == {"1", "3"}
        assert 0 <= e["pass_at"]["1"] <= e["pass_at"]["3"] <= 1 and set(e["rewards"]) == {"toy"}
    # every generate call asked for exactly the evaluated version and got it: 5 prompts x 4 evaluations
    assert sorted(v for v, *_ in spy.calls) == [0] * 5 + [2] * 5 + [4] * 5 + [5] * 5
    assert all(got == {v} and n == 3 and temperature == 1.0 for v, n, temperature, got in spy.calls)
    # the steps that waited for an evaluation waited at most its own generation time
    for step, ev in ((1, evals[0]), (3, evals[1]), (5, evals[2])):
        assert steps[step - 1]["stage_seconds"]["evaluate"] <= ev["seconds"] + 0.05
    # the evaluation's prompts are a stream of their own: training took the job's stream in order
    stream = PromptStream(PromptSettings.of(job.spec), AutoTokenizer.from_pretrained(str(tiny_dir)))
    assert [i for r in steps for i in r["sample_ids"]] == [s.index for s in stream.take(5 * 4)]


def test_status_and_prometheus_show_the_last_evaluation(tiny_dir, tmp_path):
    from grpojob.leader.server import StatusBoard

    job = make_job(tiny_dir, training={"steps": 2, "promptsPerStep": 4, "microBatchTokens": 256},
                   evaluation={"dataset": HELD_OUT, "everySteps": 0, "sampling": {"maxTokens": 4}})
    board = StatusBoard(2)
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path), board=board)
    assert run.run() == "completed"
    (ev,) = read_evaluations(tmp_path / "metrics.jsonl")
    assert ev["step"] == 2 and ev["samples_per_prompt"] == 1 and ev["greedy"] and list(ev["pass_at"]) == ["1"]
    status = board.snapshot()["evaluation"]
    assert status["step"] == 2 and status["rewardMean"] == pytest.approx(ev["reward_mean"])
    assert status["passAt"] == ev["pass_at"] and status["prompts"] == 12
    text = board.prometheus_text().decode()
    assert "grpojob_eval_step 2.0" in text
    assert f'grpojob_eval_reward_mean{{reward="total"}} {ev["reward_mean"]!r}' in text
    assert f'grpojob_eval_pass_at_k{{k="1"}} {ev["pass_at"]["1"]!r}' in text


def test_a_missing_held_out_set_fails_before_the_first_step_naming_its_field(tiny_dir, tmp_path):
    from grpojob.data import DatasetError

    job = make_job(tiny_dir, evaluation={"dataset": {"path": str(tmp_path / "nope.jsonl"), "maxPromptLength": 32},
                                         "sampling": {"maxTokens": 4}})
    with pytest.raises(DatasetError, match=r"^spec\.evaluation\.dataset\.path: '.*nope\.jsonl' does not exist"):
        build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path))
