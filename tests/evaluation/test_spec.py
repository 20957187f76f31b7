"""spec.evaluation: which steps evaluate, and the manifests it refuses (field paths)."""
from __future__ import annotations

import pytest

from grpojob.api import check

BASE = {"model": {"path": "/m"}, "dataset": {"factory": "toy", "maxPromptLength": 32}, "rewards": [{"name": "toy"}],
        "training": {"steps": 10, "microBatchTokens": 512}, "rollout": {"sampling": {"maxTokens": 8}}}
HELD_OUT = {"factory": "toy", "args": {"seed": 1}, "maxPromptLength": 32}


def job(evaluation: dict, **spec) -> dict:
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "e"},
            "spec": {**BASE, **spec, "evaluation": {"dataset": HELD_OUT, **evaluation}}}


def evaluated_steps(evaluation: dict, total: int = 10, **spec) -> list[int]:
    parsed, errors = check(job(evaluation, **spec))
    assert not errors, errors
    return [s for s in range(total + 1) if parsed.spec.evaluation.due(s, total)]


@pytest.mark.parametrize("evaluation, want", [
    ({"everySteps": 3}, [3, 6, 9, 10]),  # and always the last step's policy
    ({"everySteps": 5}, [5, 10]),  # the last step once
    ({"everySteps": 0}, [10]),  # only at the end
    ({"everySteps": 4, "atStart": True}, [0, 4, 8, 10]),  # and the initial policy
    ({}, [10]),  # default everySteps 10
])
def test_schedule(evaluation, want):
    assert evaluated_steps(evaluation) == want


def test_defaults_are_one_greedy_sample_and_pass_at_1():
    parsed, errors = check(job({}))
    ev = parsed.spec.evaluation
    assert not errors and ev.greedy and ev.ks == [1] and ev.pass_threshold == 1.0
    assert parsed.spec.evaluation_sampling.temperature == 0.0  # greedy
    assert parsed.spec.evaluation_sampling.max_tokens == 8  # rollout.sampling's
    parsed, _ = check(job({"samplesPerPrompt": 8, "sampling": {"temperature": 0.7, "maxTokens": 4}}))
    assert parsed.spec.evaluation.ks == [1, 8] and parsed.spec.evaluation_sampling.temperature == 0.7


@pytest.mark.parametrize("evaluation, spec, path, words", [
    ({"everySteps": 3}, {"weightSync": {"everySteps": 2}}, "spec.evaluation.everySteps", "not a multiple"),
    ({"samplesPerPrompt": 4, "passAt": [1, 8]}, {}, "spec.evaluation.passAt[1]", "k <= samplesPerPrompt"),
    ({"dataset": {**HELD_OUT, "maxPromptLength": 512}}, {}, "spec.evaluation.dataset.maxPromptLength",
     "exceed the rollout servers' context (40"),
    ({"sampling": {"maxTokens": 64}, "samplesPerPrompt": 2}, {}, "spec.evaluation.dataset.maxPromptLength",
     "maxTokens 64"),
    ({"dataset": {"factory": "toy", "path": "x.jsonl"}}, {}, "spec.evaluation.dataset", "exactly one of"),
    ({"samplesPerPrompt": 0}, {}, "spec.evaluation.samplesPerPrompt", ">= 1"),
])
def test_bad_evaluations_name_their_field(evaluation, spec, path, words):
    _, errors = check(job(evaluation, **spec))
    assert any(e.path == path and words in e.message for e in errors), errors


def test_evaluation_needs_rewards_even_when_environments_bring_their_own():
    doc = job({}, rollout={"workflow": "none"})
    del doc["spec"]["rewards"]
    _, errors = check(doc)
    assert [(e.path, "spec.rewards" in e.message) for e in errors] == [("spec.rewards", True)], errors


def test_a_longer_held_out_prompt_fits_a_larger_context():
    bigger = {"maxModelLen": 520, "sampling": {"maxTokens": 8}}
    assert evaluated_steps({"dataset": {**HELD_OUT, "maxPromptLength": 512}}, rollout=bigger) == [10]
