"""Checkpoints: Hugging Face format, keep-last, atomic newest, and resume equivalence."""
import json
import os
from pathlib import Path

import pytest
import torch

from grpojob import checkpoint
from grpojob.trainer.build import build

from .conftest import make_job


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b, atol=0.0):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def test_checkpoints_are_hf_models_keep_last_and_final_model(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    job = make_job(tiny_dir, training={"steps": 3}, checkpoint={"everySteps": 1, "keepLast": 2})
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"))
    tr = run.trainer
    before = _params(tr.model)
    assert run.run() == "completed"
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path / "ck")] == [2, 3]
    newest = checkpoint.latest(tmp_path / "ck")
    loaded = AutoModelForCausalLM.from_pretrained(newest / "model")
    _assert_same(_params(loaded), _params(tr.model))
    assert any(not torch.equal(before[k], v) for k, v in _params(loaded).items()), "training changed nothing"
    assert AutoTokenizer.from_pretrained(newest / "model").eos_token_id == tr.tokenizer.eos_token_id
    assert (newest / "model" / "model.safetensors").is_file()
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final-model")
    _assert_same(_params(final), _params(tr.model))
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("reward_mean", "reward_std", "rewards", "advantage_mean", "loss", "entropy", "clip_fraction",
                "importance_weight_mean", "importance_weight_max", "completion_length_mean",
                "truncated_fraction", "zero_std_group_fraction", "tokens_per_second", "policy_version",
                "policy_staleness", "grad_norm"):
        assert records[-1][key] is not None, key
    assert set(records[-1]["stage_seconds"]) == {"generate", "score", "train", "sync", "checkpoint"}
    assert records[-1]["rewards"].keys() == {"toy"}
    assert records[-1]["kl"] is None and tr.ref is None  # beta 0: no reference model
    # the pipeline's own figures, every step
    for r in records:
        assert r["rollout_idle_fraction"] is not None and 0 <= r["rollout_idle_fraction"] <= 1
        assert r["wait_seconds"] == pytest.approx(r["stage_seconds"]["generate"], abs=1e-6)
        assert r["groups_in_flight"] == 0
        assert r["weight_sync_backend"] == "inprocess" and len(r["sample_ids"]) == 8
    assert [r["published"] for r in records] == [True, True, True]  # the last step too: rollouts end in sync
    assert records[1]["rollouts"] == [{"replica": "in-process", "version": 2, "lag": 0}]
    assert records[2]["rollouts"] == [{"replica": "in-process", "version": 3, "lag": 0}]


def test_newest_complete_checkpoint_wins(tmp_path):
    (tmp_path / "step-000003" / "model").mkdir(parents=True)
    (tmp_path / "step-000003" / "model" / "config.json").write_text("{}")
    (tmp_path / "step-000003" / checkpoint.STATE_FILE).write_bytes(b"x")
    (tmp_path / ".tmp-step-000009-1" / "model").mkdir(parents=True)  # a kill mid-save
    (tmp_path / "step-000010").mkdir()  # incomplete: no state, no model
    assert checkpoint.latest(tmp_path) == tmp_path / "step-000003"
    removed = checkpoint.prune(tmp_path, keep_last=1)
    assert removed == [tmp_path / ".tmp-step-000009-1"]
    assert checkpoint.latest(tmp_path / "missing") is None


def test_tied_embeddings_checkpoint_round_trip(tiny_tied_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    job = make_job(tiny_tied_dir, training={"steps": 1})
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"))
    tr = run.trainer
    run.run()
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint.latest(tmp_path / "ck") / "model")
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    _assert_same(_params(loaded), _params(tr.model))


@pytest.mark.slow
def test_resume_gives_the_same_parameters_as_a_straight_run(tiny_dir, tmp_path):
    """4 steps straight == 2 steps, suspend (checkpoint), a new trainer resumes, 2 more steps.

    One step's generation at a time (maxStaleness 0, a push every step): the hf engine batches
    whatever requests are in flight, and float rounding depends on the batch's size, so steps whose
    generation overlaps (run-ahead) are reproducible in prompts and versions, not bit for bit."""
    over = dict(training={"steps": 4, "lrSchedule": "linear", "warmupSteps": 1},
                algorithm={"name": "grpo", "groupSize": 8, "klBeta": 0.05},
                weightSync={"everySteps": 1}, checkpoint={"everySteps": 100})
    straight = build(make_job(tiny_dir, **over), checkpoint_dir=str(tmp_path / "a"))
    assert straight.run() == "completed"

    first = build(make_job(tiny_dir, **over), checkpoint_dir=str(tmp_path / "b"),
                  on_step=lambda r: r.step == 2 and first.request_suspend())
    assert first.run() == "suspended"
    assert first.trainer.step == 2 and checkpoint.latest(tmp_path / "b").name == "step-000002"
    second = build(make_job(tiny_dir, **over), checkpoint_dir=str(tmp_path / "b"))
    assert second.trainer.step == 2 and second.trainer.version == 2
    assert second.run() == "completed"
    # float noise only (a step moves parameters by about 1e-3; threaded reductions differ by 1e-8 in the loss)
    _assert_same(_params(second.trainer.model), _params(straight.trainer.model), atol=2e-5)
    # and the run really moved: 4 steps differ from 2
    assert any(not torch.allclose(a, b) for a, b in zip(_params(first.trainer.model).values(),
                                                        _params(second.trainer.model).values()))


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_the_trained_checkpoint(tiny_dir, tmp_path, procs):
    """vLLM loads a checkpoint's model/ directory and decodes exactly what transformers decodes
    with the trained weights (which differ from the untrained model's)."""
    pytest.importorskip("vllm")
    import sys

    from transformers import AutoModelForCausalLM

    job = make_job(tiny_dir, training={"steps": 3, "learningRate": 0.01})
    build(job, checkpoint_dir=str(tmp_path / "ck")).run()
    model_dir = checkpoint.latest(tmp_path / "ck") / "model"
    prompts = [[40, 41, 42], [100, 7, 250, 9], [300], [12, 13, 14, 15, 16]]

    def hf_greedy(path):
        m = AutoModelForCausalLM.from_pretrained(path).eval()
        out = []
        for p in prompts:
            ids = m.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
            out.append(ids[0, len(p):].tolist())
        return out

    trained, base = hf_greedy(model_dir), hf_greedy(tiny_dir)
    assert trained != base, "training did not change greedy outputs: the comparison would be vacuous"
    proc = procs([sys.executable, str(Path(__file__).with_name("vllm_greedy.py")), str(model_dir),
                  json.dumps(prompts), "8"], dict(os.environ), tmp_path / "vllm.log")
    assert proc.wait(600) == 0, proc.tail()
    line = next(x for x in proc.log.read_text().splitlines() if x.startswith("TOKENS "))
    assert json.loads(line[len("TOKENS "):]) == trained
