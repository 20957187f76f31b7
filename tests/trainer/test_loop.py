"""Trainer loop edge cases: a step with nothing left to train on is a defined no-op."""
import math

import torch

from grpojob.leader.build import build

from .conftest import make_job


def constant_reward(prompt, completion, **_):
    """Every completion scores the same: every group has zero reward variance."""
    return 0.5


def test_step_with_every_group_filtered_is_a_defined_no_op(tiny_dir, tmp_path):
    job = make_job(tiny_dir, algorithm={"name": "dapo", "groupSize": 4, "maxResampleFactor": 2},
                   rewards=[{"name": f"{__name__}:constant_reward"}], training={"steps": 2, "promptsPerStep": 4})
    run = build(job, checkpoint_dir=str(tmp_path / "ck"))
    try:
        before = {k: v.clone() for k, v in run.trainer.model.state_dict().items()}
        run.rollouts.source.start()
        record = run.loop.train_step().to_json()
    finally:
        run.rollouts.close()
    assert record["skipped"] is True and record["loss"] == 0.0 and record["micro_batches"] == 0
    # dynamic sampling tried twice promptsPerStep groups (maxResampleFactor 2), all without signal
    assert record["groups"] == 8 and record["groups_resampled"] == 4 and len(record["sample_ids"]) == 8
    assert record["groups_kept"] == 0 and record["zero_std_group_fraction"] == 1.0
    assert record["reward_mean"] == 0.5 and record["rewards"] == {"constant_reward": 0.5}
    for k, v in record.items():
        assert not (isinstance(v, float) and math.isnan(v)), k
    for k, v in run.trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert record["step"] == 1 and run.trainer.version == 1  # the step still counts
