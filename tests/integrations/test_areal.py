"""AReaL's own RLVRWorkflow and MultiTurnWorkflow, unchanged, as a GRPOJob's rollout workflow over
grpojob's InferenceEngine (grpojob.integrations.areal): the tiny model learns the toy task through
RLVRWorkflow and AReaL's reward; MultiTurnWorkflow's episodes keep its loss masks; a workflow asking
n_samples > 1 is refused at start with its field."""
import asyncio
import sys
from pathlib import Path

import pytest

from grpojob.api.validate import check_plugins
from grpojob.contracts.rollout import Completion, Sample, SamplingParams

from ..trainer.conftest import make_job
from .conftest import framework, learn

AREAL = Path(__file__).resolve().parents[2] / "examples" / "frameworks" / "areal"


@pytest.fixture
def areal(monkeypatch):
    framework("areal.workflow.rlvr")
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(AREAL))


def areal_job(tiny_dir, steps=40, workflow="rlvr_toy.py:TOY_RLVR"):
    return make_job(tiny_dir, rollout={"workflow": workflow},
                    dataset={"factory": "rlvr_toy.py:toy_rows", "promptField": "question", "maxPromptLength": 32},
                    training={"steps": steps, "promptsPerStep": 16, "learningRate": 3e-3, "microBatchTokens": 256})


@pytest.mark.slow
def test_the_tiny_model_learns_through_areals_rlvr_workflow_its_reward_and_dynamic_filter_fn(tiny_dir, areal,
                                                                                           tmp_path):
    job = areal_job(tiny_dir, 60, "rlvr_toy.py:TOY_RLVR_VARIED")
    assert check_plugins(job) == []
    records = learn(job, tmp_path, lambda r: r["rewards"]["toy"] > 0.5)
    first, last = records[0]["rewards"]["toy"], [r["rewards"]["toy"] for r in records[-3:]]
    # (the first step's groups are already filtered to varied ones: measured 0.22 where unfiltered is < 0.2)
    assert first < 0.35 and min(last) > 0.5, f"reward {first:.3f} -> {last} after {len(records)} steps"
    # AReaL's reward (the toy share + 1) is the one trained on, not the spec's toy share. It scores
    # AReaL's own decoding (special tokens kept: "dog<|endoftext|>" is no animal), so at most toy + 1.
    for r in records:
        assert 1.0 - 1e-9 <= r["reward_mean"] <= r["rewards"]["toy"] + 1.0 + 1e-6
    # dynamic_filter_fn (varied: the rewards of a group differ) dropped every group it refused: no step
    # trained on a group of equal rewards (the random model's first steps are full of them)
    assert all(r["zero_std_group_fraction"] == 0 and r["groups"] == 16 for r in records)


def test_a_group_that_dynamic_filter_fn_refuses_is_rejected_with_the_group(areal, tiny_dir, tokenizer):
    from grpojob.api.plugins import resolve
    from grpojob.contracts.rollout import GroupRejected
    wf = resolve("rlvr_toy.py:TOY_RLVR_VARIED")(areal_job(tiny_dir).spec, tokenizer)
    same = Scripted([tokenizer("cat")["input_ids"]] * 8)  # eight equal answers: equal rewards
    sample = Sample(0, "name some colors :", tokenizer("name some colors :")["input_ids"],
                    {"question": "name some colors :", "answer": "colors"})
    with pytest.raises(GroupRejected, match="dynamic_filter_fn rejected the group of sample 0") as e:
        asyncio.run(wf.run(same, sample))
    assert len(e.value.group.completions) == 8  # what an evaluation scores
    mixed = Scripted([tokenizer(w)["input_ids"] for w in ["cat", "red"] * 4])
    assert len(asyncio.run(wf.run(mixed, sample)).completions) == 8


class Scripted:
    """The policy for MultiTurnWorkflow's test: a fixed answer per turn, with log-probs and a version."""

    def __init__(self, answers):
        self.answers, self.turn = answers, 0

    async def generate(self, prompt_ids, n, sampling):
        ids = self.answers[self.turn]
        self.turn += 1
        return [Completion(prompt_ids=list(prompt_ids), completion_ids=ids, logprobs=[-0.5] * len(ids),
                           policy_version=self.turn)]


def test_areals_multi_turn_workflow_keeps_its_loss_masks_and_versions(areal, tokenizer):
    from areal.api.cli_args import GenerationHyperparameters
    from areal.workflow.multi_turn import MultiTurnWorkflow

    from grpojob.integrations.areal import InferenceEngine, _episode
    from grpojob.integrations.episodes import to_completion

    wrong, right = tokenizer("cat")["input_ids"], tokenizer("red")["input_ids"]
    wf = MultiTurnWorkflow(reward_fn=multi_turn_reward, gconfig=GenerationHyperparameters(n_samples=1, max_new_tokens=4),
                           tokenizer=tokenizer, max_turns=2, turn_discount=0.5)
    engine = InferenceEngine(Scripted([wrong, right]), SamplingParams(max_tokens=4))
    traj = asyncio.run(wf.arun_episode(engine, {"messages": [{"role": "user", "content": "name colors :"}],
                                                "answer": "colors"}))
    c = to_completion(_episode(traj, 0), tokenizer)
    mask = c.loss_mask
    # turn 1 (trained), AReaL's feedback message (not), turn 2 (trained)
    trained = [t for t, m in zip(c.completion_ids, mask) if m]
    assert trained[:len(wrong)] == wrong and trained[len(wrong):len(wrong) + len(right)] == right
    assert 0 in mask and mask[0] == 1
    assert c.versions is not None and c.policy_version == 1 and max(c.versions) == 2  # per-token versions kept
    assert c.reward == pytest.approx(0.5)  # right at the second turn: AReaL's turn discount


def multi_turn_reward(prompt, completions, prompt_ids, completion_ids, answer=None, **data):
    return float("red" in completions)


def test_an_areal_workflow_asking_n_samples_above_1_is_refused_by_validate_with_its_field(areal, tiny_dir, tmp_path,
                                                                                           monkeypatch):
    (tmp_path / "wide.py").write_text(
        "from areal.api.cli_args import GenerationHyperparameters\n"
        "from areal.workflow.rlvr import RLVRWorkflow\n"
        "from grpojob.integrations.areal import workflow\n"
        "from rlvr_toy import toy_reward_fn\n"
        "WIDE = workflow(lambda spec, tok: RLVRWorkflow(reward_fn=toy_reward_fn, tokenizer=tok,\n"
        "                gconfig=GenerationHyperparameters(n_samples=4)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(AREAL))
    errors = check_plugins(areal_job(tiny_dir, workflow="wide:WIDE"))
    assert [e.path for e in errors] == ["spec.rollout.workflow"]
    assert "its AReaL workflow RLVRWorkflow asks n_samples 4" in errors[0].message


def test_an_areal_workflow_asking_n_samples_above_1_is_refused_at_start(areal, tiny_dir, tokenizer):
    from areal.api.cli_args import GenerationHyperparameters
    from areal.workflow.rlvr import RLVRWorkflow

    from grpojob.integrations.areal import workflow
    Wide = workflow(lambda spec, tok: RLVRWorkflow(reward_fn=multi_turn_reward, tokenizer=tok,
                                                   gconfig=GenerationHyperparameters(n_samples=4)))
    with pytest.raises(ValueError, match=r"^spec.rollout.workflow: its AReaL workflow RLVRWorkflow asks n_samples 4"):
        Wide(areal_job(tiny_dir).spec, tokenizer)


REMAX = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "areal"


@pytest.mark.slow
def test_areals_remax_workflow_in_its_own_names_trains_the_reward_difference(tiny_dir, tmp_path, monkeypatch):
    """examples/plugins/areal/remax_areal.py: AReaL's guide's ReMaxRLVRWorkflow (arun_episode,
    engine.agenerate(ModelRequest)) through grpojob.integrations.areal, with no group baseline."""
    framework("areal.workflow.rlvr")
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(REMAX))
    job = make_job(tiny_dir, rollout={"workflow": "remax_areal.py:REMAX"},
                   dataset={"factory": "remax_areal.py:toy_messages", "messagesField": "messages",
                            "maxPromptLength": 32},
                   algorithm={"groupSize": 8, "advantageNormalization": "none"},
                   training={"steps": 6, "promptsPerStep": 8, "learningRate": 3e-3, "microBatchTokens": 256})
    assert check_plugins(job) == []
    records = learn(job, tmp_path, lambda r: False)
    assert len(records) == 6
    for r in records:
        # the episodes' rewards are sample - greedy (the spec's toy reward is the sampled share alone), and
        # they are the advantages as they are: no group mean taken (GRPO's would average exactly 0)
        assert r["advantage_mean"] == pytest.approx(r["reward_mean"], abs=1e-6)
        assert r["rewards"]["toy"] - r["reward_mean"] >= -1e-6  # the greedy reward (>= 0) subtracted
    assert any(abs(r["advantage_mean"]) > 1e-3 for r in records)
    assert any(r["rewards"]["toy"] - r["reward_mean"] > 1e-3 for r in records)
