"""AReaL's agent workflows (a class with `async def run(self, data, **extra_kwargs)`, written as AReaL's
own `MathAgent`/`MultiTurnMathAgent` are) over our agent sessions (grpojob.integrations.areal_agent),
with the real parts: a rollout server process, the trainer leader's trajectory API, the real `openai`
client the agent builds from `base_url`, `api_key` and `http_client`. The group handed to training
holds exactly the tokens the server served, turn by turn; the agent's feedback turn is masked out;
the reward is the agent's, by AReaL's convention; the example agent trains a job whose reward rises."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from grpojob.integrations import areal_agent as driver
from tests.rollout.harness import TOKEN
from tests.trajectories.test_sessions_server import stack  # noqa: F401 - the fixture: server + trajectory API

from .conftest import framework, run_example

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "frameworks" / "areal"


class TurnsAgent:
    """As AReaL's MultiTurnMathAgent: two turns with a feedback message between, a reward per completion id."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs.copy()

    async def run(self, data, **extra_kwargs):
        client = AsyncOpenAI(base_url=extra_kwargs.get("base_url") or os.getenv("OPENAI_BASE_URL"),
                             api_key=extra_kwargs.get("api_key") or os.getenv("OPENAI_API_KEY"),
                             http_client=extra_kwargs.get("http_client"), max_retries=0)
        messages = data["messages"].copy()
        rewards = {}
        for turn in range(2):
            response = await client.chat.completions.create(messages=messages, model="default", **self.kwargs)
            messages.append(response.choices[0].message.model_dump(exclude_none=True))
            rewards[response.id] = 0.25 * (turn + 1)
            messages.append({"role": "user", "content": "try once more ."})
        return rewards


class FlakyAgent:
    """One turn; raises on its first episode (AReaL rejects it); the reward is the row's `score`."""

    def __init__(self):
        self.calls = 0

    async def run(self, data, **extra_kwargs):
        self.calls += 1
        first = self.calls == 1
        client = AsyncOpenAI(base_url=extra_kwargs["base_url"], api_key=extra_kwargs["api_key"],
                             http_client=extra_kwargs["http_client"], max_retries=0)
        await client.chat.completions.create(messages=data["messages"], model="default", max_tokens=3)
        if first:
            raise RuntimeError("the agent's tool crashed")
        return data["score"]


class OwnClientAgent:
    """Builds its client without the http_client it was given: no session headers go out."""

    async def run(self, data, **extra_kwargs):
        client = AsyncOpenAI(base_url=extra_kwargs["base_url"], api_key=extra_kwargs["api_key"], max_retries=0)
        await client.chat.completions.create(messages=data["messages"], model="default", max_tokens=2)
        return 1.0


class SyncAgent:
    def run(self, data, **extra_kwargs):
        return 1.0


def _play(srv, agent, row, group_size=2):
    async def go():
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
            return await driver.play_group(agent, http, srv.url + "/v1", TOKEN, row, group_size, environment="areal",
                                           retries=1)
    return asyncio.run(go())


@pytest.mark.slow
def test_an_areal_multi_turn_agent_trains_on_exactly_the_served_tokens(stack, tokenizer):  # noqa: F811
    agent = driver.load_agent(f"{__name__}:TurnsAgent", {"max_tokens": 4, "extra_body": {"return_token_ids": True}})
    row = {"messages": [{"role": "user", "content": "list animals :"}], "answer": "animals"}
    episodes = _play(stack["srv"], agent, row)
    (group,) = stack["manager"].next_step().groups
    assert [e["session"] for e in episodes] != [None, None] and len(group.completions) == 2
    for c, ep in zip(group.completions, episodes):
        served = [(ch["prompt_token_ids"], ch["token_ids"]) for ch in (r["choices"][0] for r in ep["responses"])]
        (first_prompt, _), (last_prompt, last_ids) = served[0], served[-1]
        assert c.prompt_ids == first_prompt
        assert first_prompt + c.completion_ids == last_prompt + last_ids  # the exact tokens, in order
        assert [t for t, m in zip(c.completion_ids, c.loss_mask) if m] == [t for _, ids in served for t in ids]
        masked = tokenizer.decode([t for t, m in zip(c.completion_ids, c.loss_mask) if not m])
        assert "try once more ." in masked  # the agent's own feedback turn: context, not trained on
    # AReaL's dict of rewards by completion id: the session (a concat-style trajectory) gets its last one's
    assert group.rewards == [0.5, 0.5] and all(ep["result"] for ep in episodes)
    assert all(list(ep["result"]) == [r["id"] for r in ep["responses"]] for ep in episodes)


@pytest.mark.slow
def test_an_episode_that_raises_is_rejected_and_run_again_and_a_float_is_the_reward(stack):  # noqa: F811
    agent = FlakyAgent()
    episodes = _play(stack["srv"], agent, {"messages": [{"role": "user", "content": "hi"}], "score": 0.75})
    (group,) = stack["manager"].next_step().groups
    assert agent.calls == 3 and group.rewards == [0.75, 0.75]
    assert sorted(e["session"].rsplit("-", 1)[1] for e in episodes) == ["0", "1"]  # one retried


@pytest.mark.slow
def test_an_agent_that_bypasses_the_http_client_is_told_the_fix(stack):  # noqa: F811
    with pytest.raises(driver.AgentError, match=r"extra_kwargs\['http_client'\]"):
        _play(stack["srv"], OwnClientAgent(), {"messages": [{"role": "user", "content": "hi"}]}, group_size=1)


def test_what_does_not_fit_is_refused_at_start_naming_the_flag():
    with pytest.raises(SystemExit, match=r"--agent .*SyncAgent.run is not an async function"):
        driver.load_agent(f"{__name__}:SyncAgent")
    with pytest.raises(SystemExit, match=r"--agent .*has no attribute 'Nope'"):
        driver.load_agent(f"{__name__}:Nope")
    ns = driver.argparse.Namespace
    with pytest.raises(SystemExit, match="--mode subproc: only AReaL's inline mode"):
        driver.check_args(ns(mode="subproc", export_style="concat"))
    with pytest.raises(SystemExit, match="--export-style individual: a session is one trajectory"):
        driver.check_args(ns(mode="inline", export_style="individual"))
    for bad in (None, "1.0", True):
        with pytest.raises(driver.AgentError, match="AReaL takes a float"):
            driver.session_reward(bad, ["a"])
    with pytest.raises(driver.AgentError, match=r"rewards for \['zz'\]"):
        driver.session_reward({"zz": 1.0}, ["a", "b"])
    assert driver.session_reward({"a": 1.0}, ["a", "b"]) == 0.0  # the last left out: 0, as AReaL warns
    assert driver.session_reward(2, ["a"]) == 2.0


def test_an_areal_rollout_workflow_named_as_an_agent_is_refused():
    framework("areal.api.workflow_api")
    with pytest.raises(SystemExit, match="an AReaL RolloutWorkflow .* spec.rollout.workflow"):
        driver.load_agent("areal.workflow.rlvr:RLVRWorkflow")


@pytest.mark.slow
def test_the_example_agent_learns_through_grpojob_run(tmp_path):
    """examples/frameworks/areal/words_agent.yaml end to end, AReaL's own AsyncRewardWrapper in the agent."""
    framework("areal.api")
    import yaml

    doc = yaml.safe_load((EXAMPLE / "words_agent.yaml").read_text())
    cmd = doc["spec"]["environments"][0]["command"]
    doc["spec"]["environments"][0]["command"] = [sys.executable, *cmd[1:]]
    doc["spec"]["environments"][0]["command"][cmd.index("--data") + 1] = str(EXAMPLE / "words.jsonl")
    doc["spec"]["code"]["localPath"] = str(EXAMPLE)
    doc["spec"]["model"]["path"] = str(tmp_path / "tiny-model")
    _, first, last = run_example(doc, tmp_path, steps=20)
    # measured 0.053 -> 0.474 (first and last 3 steps) in 262 s at a load of 5 on 2 cores
    assert last >= first + 0.2, f"reward {first:.3f} -> {last:.3f}"
