"""cosmos-rl code in a GRPOJob: the example's dataset class (cosmos-rl's setup(config, tokenizer) and
query_reference_answer) and reward (its (value, dict) result), and a user's cosmos-rl loss_fn behind
spec.trainer.lossFn given each micro-batch in cosmos-rl's layout: the tiny model learns the toy task
through them, and each visibly took effect."""
import sys
from pathlib import Path

import pytest

from grpojob.api.validate import check_plugins

from ..trainer.conftest import make_job
from .conftest import learn

ROOT = Path(__file__).resolve().parents[2]
COSMOS = ROOT / "examples" / "plugins" / "cosmos"
CODE = Path(__file__).parent / "code"


@pytest.fixture
def code_path(monkeypatch):
    monkeypatch.syspath_prepend(str(CODE))
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(COSMOS))
    yield
    sys.modules.pop("cosmos_loss", None)


def cosmos_job(tiny_dir, steps):
    return make_job(tiny_dir, dataset={"factory": None, "class": "category_dataset.py:CategoryDataset",
                                       "args": {"size": 48}, "maxPromptLength": 32},
                    rewards=[{"name": "category_reward.py:category_reward"}],
                    trainer={"lossFn": "cosmos_loss:loss_fn"},
                    training={"steps": steps, "promptsPerStep": 16, "learningRate": 3e-3, "microBatchTokens": 256})


def test_a_loss_fn_that_cosmos_cannot_call_is_refused_with_its_field(tiny_dir, code_path, tmp_path):
    (tmp_path / "bad_loss.py").write_text("def loss_fn(logps, advantages):\n    return logps.sum()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        job = cosmos_job(tiny_dir, 1)
        job.spec.trainer.loss_fn = "bad_loss:loss_fn"
        errors = check_plugins(job)
    finally:
        sys.path.remove(str(tmp_path))
    assert [e.path for e in errors] == ["spec.trainer.lossFn"]
    assert "takes 2 positional arguments; cosmos-rl passes 7" in errors[0].message


@pytest.mark.slow
def test_the_tiny_model_learns_through_cosmos_rl_dataset_reward_and_loss_fn(tiny_dir, code_path, tmp_path):
    job = cosmos_job(tiny_dir, 60)
    assert check_plugins(job) == []
    import cosmos_loss
    records = learn(job, tmp_path, lambda r: r["reward_mean"] > 0.5)
    first, last = records[0]["reward_mean"], [r["reward_mean"] for r in records[-3:]]
    assert first < 0.2 and min(last) > 0.5, f"reward {first:.3f} -> {last} after {len(records)} steps"
    # The loss_fn was the loss: each step's loss is the sum of what it returned for that step's
    # micro-batches, it got cosmos-rl's layout (one advantage per sequence, spread over its tokens)...
    calls = cosmos_loss.CALLS
    assert calls and all(c["adv_const"] for c in calls)
    per_step = [r["micro_batches"] for r in records]
    assert len(calls) == sum(per_step)
    at = 0
    for r, n in zip(records, per_step):
        assert r["loss"] == pytest.approx(sum(c["loss"] for c in calls[at:at + n]), abs=1e-6)
        assert r["extra"]["cosmos_pg_loss"] == pytest.approx(r["loss"], abs=1e-6)
        assert r["trained_tokens"] == sum(c["tokens"] for c in calls[at:at + n])  # no sequence skipped
        at += n
    # ...the dataset class's reference answers reached the reward, whose dict part is reported
    assert all("category_reward/words" in r["rewards"] for r in records)
