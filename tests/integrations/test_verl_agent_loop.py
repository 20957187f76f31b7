"""verl's own SingleTurnAgentLoop, unchanged, as a GRPOJob's rollout workflow over grpojob's
server_manager (grpojob.integrations.verl): the tiny model learns the toy task through it; its
episodes carry the generated tokens and log-probs exactly, with the prompt verl's loop rendered;
a user's loop scoring its own trajectories is the reward trained on; a loop reading a setting
grpojob lacks is refused at start with the field."""
import asyncio
from pathlib import Path

import pytest

from grpojob.api.validate import check_plugins
from grpojob.contracts.rollout import Completion, Sample

from ..trainer.conftest import make_job
from .conftest import framework, learn

VERL = Path(__file__).resolve().parents[2] / "examples" / "frameworks" / "verl"


@pytest.fixture
def verl(monkeypatch):
    framework("verl.experimental.agent_loop.single_turn_agent_loop")
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(VERL))


def verl_job(tiny_dir, workflow="single_turn_toy.py:SINGLE_TURN", steps=40, lr=3e-3):
    return make_job(tiny_dir, rollout={"workflow": workflow},
                    dataset={"factory": "single_turn_toy.py:toy_rows", "messagesField": "prompt",
                             "maxPromptLength": 32},
                    training={"steps": steps, "promptsPerStep": 16, "learningRate": lr, "microBatchTokens": 512})


class Scripted:
    """The policy: fixed tokens with log-probs and a version per call; records the prompts it got."""

    def __init__(self, ids):
        self.ids, self.prompts = ids, []

    async def generate(self, prompt_ids, n, sampling):
        self.prompts.append(list(prompt_ids))
        return [Completion(prompt_ids=list(prompt_ids), completion_ids=list(self.ids),
                           logprobs=[-0.25 * (i + 1) for i in range(len(self.ids))], policy_version=3)]


def test_single_turn_agent_loop_gives_the_exact_tokens_and_log_probs(verl, tiny_dir, tokenizer):
    from grpojob.api.plugins import resolve
    Loop = resolve("single_turn_toy.py:SINGLE_TURN")
    job = verl_job(tiny_dir)
    wf = Loop(job.spec, tokenizer)
    ids = tokenizer("red blue")["input_ids"]
    policy = Scripted(ids)
    row = {"prompt": [{"role": "user", "content": "name some colors :"}], "answer": "colors"}
    group = asyncio.run(wf.run(policy, Sample(0, "name some colors :", [1, 2], row)))
    # verl's loop rendered the prompt (the chat template, through its continuous-token builder)
    text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    assert len(policy.prompts) == 8 and all(tokenizer.decode(p) == text for p in policy.prompts)
    assert len(group.completions) == 8
    for c, sent in zip(group.completions, policy.prompts):  # what was generated from, and what came back
        assert c.prompt_ids == sent and c.completion_ids == ids and c.policy_version == 3
        assert c.logprobs == [-0.25 * (i + 1) for i in range(len(ids))] and c.loss_mask is None


@pytest.mark.slow
def test_the_tiny_model_learns_through_a_loop_built_on_verls_single_turn_agent_loop(verl, tiny_dir, tmp_path):
    """ScoredSingleTurn runs SingleTurnAgentLoop.run unchanged and sets reward_score (the toy share
    + 1): that is the reward trained on (the spec's toy reward is still computed and reported)."""
    job = verl_job(tiny_dir, "single_turn_toy.py:SCORED", steps=50, lr=1e-2)
    assert check_plugins(job) == []
    records = learn(job, tmp_path, lambda r: r["rewards"]["toy"] > 0.5)
    first, last = records[0]["rewards"]["toy"], [r["rewards"]["toy"] for r in records[-3:]]
    assert first < 0.2 and min(last) > 0.5, f"reward {first:.3f} -> {last} after {len(records)} steps"
    for r in records:  # the loop's reward_score, not the spec's toy share, is the reward
        assert r["reward_mean"] == pytest.approx(r["rewards"]["toy"] + 1.0, abs=1e-6)


def test_a_verl_loop_reading_a_setting_grpojob_lacks_is_refused_at_start_with_the_field(verl, tiny_dir, tokenizer):
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from grpojob.integrations.verl import agent_loop

    class NeedsMultiTurn(SingleTurnAgentLoop):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.max_turns = self.config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns

    with pytest.raises(ValueError, match=r"^spec.rollout.workflow: the verl agent loop NeedsMultiTurn cannot be "
                                         r"built here: .*multi_turn"):
        agent_loop(NeedsMultiTurn)(verl_job(tiny_dir).spec, tokenizer)
    # given the setting (verl's config under its own names), it is built
    wf = agent_loop(NeedsMultiTurn, overrides={"actor_rollout_ref": {"rollout": {"multi_turn": {
        "max_assistant_turns": 2}}}})(verl_job(tiny_dir).spec, tokenizer)
    assert wf.config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 2


def test_a_verl_loop_sending_images_gets_a_named_refusal_not_a_traceback(verl, tiny_dir, tokenizer):
    from grpojob.integrations.episodes import EpisodeError
    from grpojob.integrations.verl import ServerManager
    from grpojob.contracts.rollout import SamplingParams

    manager = ServerManager(Scripted([5]), SamplingParams(max_tokens=4))
    with pytest.raises(EpisodeError, match=r"^spec.rollout.workflow: the verl agent loop sent image_data"):
        asyncio.run(manager.generate("r", prompt_ids=[1, 2], sampling_params={}, image_data=["img"]))
