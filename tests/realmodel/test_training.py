"""Full and LoRA training of the real model (two steps, in process): each checkpoints, resumes from its
checkpoint with the trained weights, and `grpojob export` writes a model that transformers loads and
generates with, equal to what the trainer holds."""
from __future__ import annotations

import gc

import pytest
import torch

from grpojob.checkpoint import layout
from grpojob.cli import main as cli
from grpojob.leader.build import build

from ..helpers.jobs import job_from
from ..rollout.harness import greedy

pytestmark = pytest.mark.slow

BASE = {
    "model": {"path": None},
    "dataset": {"factory": "toy", "maxPromptLength": 48},
    "rewards": [{"name": "tests.realmodel.rewards:length"}],  # varies within a group: every step trains
    "algorithm": {"groupSize": 2},
    "training": {"steps": 1, "promptsPerStep": 2, "microBatchTokens": 512},
    "rollout": {"backend": "hf", "sampling": {"maxTokens": 6, "temperature": 1.0}, "maxModelLen": 128},
}
MODES = {"full": ({}, 1e-5), "lora": ({"lora": {"rank": 4, "alpha": 8}}, 1e-3)}


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture(autouse=True)
def _eager():
    """The trainer compiles a model this size on a CPU (learner.sizing): 20-60 s and GBs of memory
    that two steps never earn back; what is tested here does not depend on it."""
    with torch.compiler.set_stance("force_eager"):
        yield


@pytest.mark.parametrize("mode", MODES)
def test_real_model_trains_checkpoints_resumes_and_exports(mode, smollm2_dir, smollm2_tokenizer, questions, tmp_path):
    from transformers import AutoModelForCausalLM

    model, lr = MODES[mode]
    ck = tmp_path / "ck"

    def job(steps):
        return job_from(BASE, smollm2_dir, model={"path": str(smollm2_dir), **model},
                        training={**BASE["training"], "steps": steps, "learningRate": lr},
                        checkpoint={"path": str(ck), "everySteps": 1})

    run = build(job(1), checkpoint_dir=str(ck), run_dir=str(tmp_path / "run1"))
    before = _trainable(run.trainer.model)
    assert run.run() == "completed"
    trained = _trainable(run.trainer.model)
    assert any(not torch.equal(before[n], p) for n, p in trained.items()), "a step changed no weight"
    step1 = layout.latest(ck)
    assert step1 is not None and step1.name == "step-000001"
    del run, before  # the next trainer's model, optimizer and engine replace these (a few GB)
    gc.collect()

    again = build(job(2), checkpoint_dir=str(ck), run_dir=str(tmp_path / "run2"))
    assert again.resumed_from == step1 and again.trainer.step == 1
    assert all(torch.equal(p, trained[n]) for n, p in _trainable(again.trainer.model).items())
    assert again.run() == "completed" and layout.latest(ck).name == "step-000002"
    policy = {k: v.detach() for k, v in again.trainer.model.state_dict().items()}

    def export(out, *flags):
        assert cli(["export", str(ck), str(tmp_path / out), *flags]) == 0
        return AutoModelForCausalLM.from_pretrained(str(tmp_path / out), dtype=torch.float32).eval()

    if mode == "full":  # the trainer's own weights, as they are
        exported = export("exported")
        assert {k: v for k, v in exported.state_dict().items()}.keys() == policy.keys()
        assert all(torch.equal(v, policy[k]) for k, v in exported.state_dict().items())
    else:  # the base with the adapter merged in: what PEFT computes from the base and the adapter alone
        from peft import PeftModel

        exported = export("merged", "--merged")
        assert cli(["export", str(ck), str(tmp_path / "adapter")]) == 0
        base = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
        plain = {k: v.clone() for k, v in base.state_dict().items()}
        with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
        ids = torch.tensor([questions[0]])
        with torch.no_grad():
            want, got = with_adapter(input_ids=ids).logits, exported(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-3), (got - want).abs().max()
        assert not all(torch.equal(v, plain[k]) for k, v in exported.state_dict().items()), "the adapter merged nothing"
    assert not any(".lora_" in n for n, _ in exported.named_parameters())  # a plain model either way
    tokens, _ = greedy(exported, smollm2_tokenizer, questions[0], 6)  # and it generates
    assert len(tokens) == 6 and smollm2_tokenizer.decode(tokens).strip()
