"""TRL's environment_factory classes as a workflow: examples/environments/trl/words_env.py (written
for TRL's GRPOTrainer, no grpojob import) runs unchanged. The tool path is checked token by token;
the tiny model learns the toy task through it, in-process (the trainer's own loop)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from grpojob.contracts.rollout import Completion, Sample

from tests.helpers.jobs import job_from
from tests.rollout.inprocess import ModelGenerator

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "environments" / "trl"
BASE = {
    "model": {"path": None},
    "dataset": {"factory": "toy", "maxPromptLength": 32},
    "rewards": [{"name": "toy"}],
    "algorithm": {"name": "grpo", "groupSize": 8},
    "training": {"steps": 4, "promptsPerStep": 8, "learningRate": 3e-3, "microBatchTokens": 4096},
    "rollout": {"backend": "hf", "sampling": {"maxTokens": 4}, "maxModelLen": 512, "workflow": "workflow:Workflow"},
}
CALL = '<tool_call>{"name": "check_word", "arguments": {"word": "cat"}}</tool_call>'


@pytest.fixture
def workflow_cls(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # spec.code.localPath in the example's manifest
    from workflow import Workflow
    return Workflow


class ToolCallingPolicy(ModelGenerator):
    """Stand-in for a model that calls tools (the tiny random one never writes a valid call): its
    first answer is CALL's tokens, every later one the real tiny model's."""

    def __init__(self, model, tokenizer):
        super().__init__(model, tokenizer, version=3)
        self.call_ids = tokenizer(CALL, add_special_tokens=False)["input_ids"]

    async def generate(self, prompt_ids, n, sampling, *, min_version=None):
        if not self.calls:
            self.calls.append({"prompt_ids": list(prompt_ids)})
            return [Completion(prompt_ids=list(prompt_ids), completion_ids=list(self.call_ids),
                               logprobs=[-0.5] * len(self.call_ids), policy_version=2, text=CALL)]
        self.version = 4
        return await super().generate(prompt_ids, n, sampling)


def test_tools_from_public_methods_their_results_masked_and_get_reward_added(workflow_cls, tiny_dir, tokenizer):
    from tests.rollout.harness import load_model

    workflow = workflow_cls(job_from(BASE, tiny_dir).spec, tokenizer)
    workflow.group_size = 1  # one episode: the stand-in answers its first turn
    policy = ToolCallingPolicy(load_model(tiny_dir), tokenizer)
    sample = Sample(index=0, prompt="list animals :", prompt_ids=[1], row={"prompt": "list animals :",
                                                                           "answer": "animals"})
    group = asyncio.run(workflow.run(policy, sample))
    first, second = policy.calls[0]["prompt_ids"], policy.calls[1]["prompt_ids"]
    text = tokenizer.decode(first)
    assert "check_word" in text and "belongs to the category" in text  # the method's schema, from its docstring
    assert "list animals : ( answer with words )" in text  # reset()'s observation on the user message
    suffix = workflow.tool_suffix([{"role": "tool", "name": "check_word", "content": "yes"}])
    assert second == first + policy.call_ids + suffix  # exact tokens: nothing re-tokenised
    c = group.completions[0]
    answer = c.completion_ids[len(policy.call_ids) + len(suffix):]
    assert c.prompt_ids == first and c.completion_ids == policy.call_ids + suffix + answer
    assert c.loss_mask == [1] * len(policy.call_ids) + [0] * len(suffix) + [1] * len(answer)
    assert c.logprobs[:len(policy.call_ids)] == [-0.5] * len(policy.call_ids)
    assert c.policy_version == 2 and set(c.versions) == {2, 4}
    from grpojob.rewards.builtin import toy
    # get_reward (the checked word "cat" is an animal: 1.0) + the job's toy reward on the last answer
    assert c.reward == pytest.approx(1.0 + toy("", tokenizer.decode(answer, skip_special_tokens=True), "animals"))


def test_an_environment_without_reset_names_the_fix():
    from grpojob.integrations.trl_env import environment_workflow

    with pytest.raises(TypeError, match="needs a callable reset"):
        environment_workflow(object)


@pytest.mark.slow
def test_the_tiny_model_learns_through_the_environment(workflow_cls, tiny_dir, tmp_path):
    from grpojob.leader.build import build

    job = job_from(BASE, tiny_dir, training={"steps": 40, "promptsPerStep": 8, "learningRate": 6e-3})
    records = []

    def on_step(r):
        records.append(r.to_json())
        if len(records) >= 10 and _mean(records[-5:]) > _mean(records[:5]) + 0.15:
            run.request_suspend()  # learned enough: stop early

    run = build(job, checkpoint_dir=str(tmp_path / "ck"), on_step=on_step)
    run.run()
    first, last = _mean(records[:5]), _mean(records[-5:])
    print(f"trl env: reward {first:.3f} -> {last:.3f} in {len(records)} steps")
    # measured: 0.10 -> 0.30 in 50 steps (the tools' system block makes the prompt 370 tokens long)
    assert first < 0.25 and last > first + 0.12, f"reward {first:.3f} -> {last:.3f} after {len(records)} steps"


def _mean(records) -> float:
    return sum(r["reward_mean"] for r in records) / len(records)
