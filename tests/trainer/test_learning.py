"""Learning: a tiny random model learns the toy task (reward = share of completion words in the
asked category) from below 0.3 to above 0.8 mean reward within a bounded number of steps."""
import pytest

from grpojob.leader.build import build

from .conftest import make_job

# What we use of transformers, torch and the trainer: every CI dependency set runs the grpo case (a
# contract); the other two are the algorithms' own and depend on nothing the sets change, so only the
# newest set runs them.

MAX_STEPS = 150


def _learn(job, tmp_path):
    records = []

    def on_step(r):
        records.append(r.to_json())
        recent = [x["reward_mean"] for x in records[-3:]]
        if len(recent) == 3 and min(recent) > 0.8:
            run.request_suspend()  # learned: stop early (the trainer checkpoints and returns)

    run = build(job, checkpoint_dir=str(tmp_path / "ck"), on_step=on_step)
    run.run()
    return records


CASES = {
    "grpo": dict(algorithm={"name": "grpo", "groupSize": 8}),
    "dapo": dict(algorithm={"name": "dapo", "groupSize": 8}),
    # stale rollout weights (pushed every 2nd step) corrected by truncated importance weights,
    # plus a KL penalty to the frozen reference
    "grpo-stale-kl": dict(algorithm={"name": "grpo", "groupSize": 8, "klBeta": 0.01, "maxStaleness": 1},
                          weightSync={"everySteps": 2}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.contract] if c == "grpo" else [])
                                  for c in CASES])
def test_tiny_model_learns_toy_task(tiny_dir, tmp_path, case):
    job = make_job(tiny_dir, training={"steps": MAX_STEPS, "promptsPerStep": 16, "learningRate": 3e-3,
                                       "microBatchTokens": 2048}, **CASES[case])
    records = _learn(job, tmp_path)
    first = records[0]["reward_mean"]
    last = [r["reward_mean"] for r in records[-3:]]
    assert first < 0.3, f"the random model already scores {first}"
    assert min(last) > 0.8, f"{case}: reward {first:.3f} -> {last} after {len(records)} steps"
    assert len(records) < MAX_STEPS
    if case == "grpo-stale-kl":
        assert max(r["policy_staleness"] for r in records) > 0  # every other step samples version v-1
        assert any(abs(r["importance_weight_mean"] - 1.0) > 1e-4 for r in records)
        assert records[-1]["kl"] > 0
    if case == "dapo":  # dynamic sampling drops groups with equal rewards once the task is learned
        dropped = [r for r in records if r["groups_kept"] < r["groups"]]
        assert dropped and all(r["zero_std_group_fraction"] > 0 for r in dropped)
