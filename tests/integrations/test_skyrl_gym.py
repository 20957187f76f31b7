"""skyrl-gym's own environments (gsm8k_multi_turn, unchanged) played with SkyRL's agent loop over
our agent sessions: a rollout server process, the trainer leader's trajectory API, the real openai
client. The group handed to training holds the model's tokens (trained) and the environment's
observations (masked out); the reward is the sum of the per-turn rewards."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.rollout.harness import TOKEN
from tests.trajectories.test_sessions_server import stack  # noqa: F401 - the fixture: server + trajectory API

skyrl_gym = pytest.importorskip("skyrl_gym", reason="skyrl-gym (the environments set)")
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from grpojob.integrations import skyrl_gym as driver  # noqa: E402

from .conftest import run_example  # noqa: E402

pytestmark = pytest.mark.slow


class Countdown(BaseTextEnv):
    """A registered environment of our own: rewards 0.25 then 0.5 over two turns (their sum is 0.75)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()

    def step(self, action):
        self.turns += 1
        done = self.turns == 2
        return {"observations": [] if done else [{"role": "user", "content": "again ."}],
                "reward": 0.25 * self.turns, "done": done, "metadata": {}}


def _play(srv, row, **kw):
    async def go():
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
            return await driver.play_group(client, http, srv.url + "/v1", row, 2, environment="skyrl", **kw)
    return asyncio.run(go())


def test_gsm8k_multi_turn_observations_are_masked_out(stack, tokenizer):  # noqa: F811
    row = {"prompt": [{"role": "user", "content": "what is 3 + 4 ?"}], "env_class": "gsm8k_multi_turn",
           "reward_spec": {"method": "rule", "ground_truth": "7"}, "extra_info": {"max_turns": 2}}
    episodes = _play(stack["srv"], row, max_turns=4)
    assert [e["turns"] for e in episodes] == [2, 2]  # the env's max_turns ended them (the tiny model is wrong)
    (group,) = stack["manager"].next_step().groups
    for c, ep in zip(group.completions, episodes):
        masked = tokenizer.decode([t for t, m in zip(c.completion_ids, c.loss_mask) if not m])
        assert "Now provide only the final numeric answer" in masked  # gsm8k_multi_turn's own observation
        trained = tokenizer.decode([t for t, m in zip(c.completion_ids, c.loss_mask) if m])
        assert "final numeric answer" not in trained
        assert c.reward == pytest.approx(ep["reward"])


def test_per_turn_rewards_are_summed(stack):  # noqa: F811
    skyrl_gym.register(id="countdown-test", entry_point=f"{__name__}:Countdown")
    episodes = _play(stack["srv"], {"prompt": [{"role": "user", "content": "go"}]}, env_class="countdown-test")
    assert [e["rewards"] for e in episodes] == [[0.25, 0.5]] * 2
    (group,) = stack["manager"].next_step().groups
    assert group.rewards == [0.75, 0.75]


def test_a_row_without_an_environment_names_the_fix(stack):  # noqa: F811
    with pytest.raises(ValueError, match="no --env-class"):
        _play(stack["srv"], {"prompt": [{"role": "user", "content": "go"}]})


def test_the_example_learns_through_grpojob_run(tmp_path):
    """examples/environments/skyrl/words.yaml end to end: measured 0.06 -> 0.45 in 40 steps (198 s)."""
    import sys
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "examples/environments/skyrl/words.yaml").read_text())
    doc["spec"]["environments"][0]["command"] = [
        sys.executable, "-m", "grpojob.integrations.skyrl_gym", "--data",
        str(root / "examples/environments/skyrl/rows.jsonl"), "--import", "words_env"]
    doc["spec"]["code"]["localPath"] = str(root / "examples/environments/skyrl")
    doc["spec"]["model"]["path"] = str(tmp_path / "tiny-model")
    _, first, last = run_example(doc, tmp_path, steps=25)
    assert last >= first + 0.12, f"reward {first:.3f} -> {last:.3f}"  # measured 0.05 -> 0.26 at 25 steps
