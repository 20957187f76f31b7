"""A judge server (the real aiohttp app over the tiny reward model) and the trainer's scorer against
it: batched scores behind the job's token, probes and metrics, and each failure policy when the
judge cannot answer."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from grpojob.api import check
from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.auth import ENV_TOKEN_FILE, Auth
from grpojob.judge.engine import HFClassifier
from grpojob.judge.server import Server
from grpojob.plan import ENV_JUDGE_URLS
from grpojob.rewards import RewardError, RewardScorer
from grpojob.rewards.judges import GroupSkipped

from .test_spec import _doc

TOKEN = "t" * 43


def _job(model, **judge):
    job, errors = check(_doc([{"judge": "words"}], [{"name": "words", "model": str(model),
                                                      "template": "{completion}", **judge}]))
    assert not errors, errors
    return job


@pytest.fixture
async def judge_url(reward_model):
    job = _job(reward_model, maxBatchSize=8)
    server = Server(job.spec.judges[0], Auth(TOKEN), "judge-words-0")
    runner = aiohttp.web.AppRunner(server.app())
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/readyz") as r:
            assert r.status == 503 and "loading" in (await r.json())["reason"]
    server.loaded(await asyncio.to_thread(HFClassifier, job.spec.judges[0]))
    yield url, server
    await server.batcher.close()
    await runner.cleanup()


def _group(texts: list[str]) -> Group:
    return Group(sample=Sample(index=0, prompt="list animals :", prompt_ids=[1], row={"answer": "animals"}),
                 completions=[Completion(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], policy_version=0, text=t) for t in texts])


def _scorer(job, monkeypatch, tmp_path, urls) -> RewardScorer:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "token"))
    monkeypatch.setenv(ENV_JUDGE_URLS, json.dumps({"words": urls}))
    return RewardScorer(job.spec, tokenizer=None)


async def test_scores_behind_the_token_batched_with_probes_and_metrics(judge_url, reward_model, monkeypatch, tmp_path):
    url, server = judge_url
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/score", json={"items": [{"completion": " dog"}]}) as r:
            assert r.status == 401
        auth = Auth(TOKEN).headers()
        async with s.post(f"{url}/score", json={"items": [{"prompt": "x"}]}, headers=auth) as r:
            assert r.status == 400 and "items.0.completion" in (await r.json())["error"]
        async with s.get(f"{url}/readyz") as r:
            assert r.status == 200
    scorer = _scorer(_job(reward_model), monkeypatch, tmp_path, [url])
    groups = [_group([" dog cat", " red blue", " xq", "ing uter"]) for _ in range(5)]
    await asyncio.gather(*(scorer.score_group(g) for g in groups))  # 20 texts, batches of at most 8
    rewards = groups[0].rewards
    assert min(rewards[:2]) > 0.7 > 0.5 > max(rewards[2:]), rewards  # it prefers category words
    assert groups[0].reward_parts["words"] == rewards and all(g.rewards == rewards for g in groups)
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    assert 'grpojob_judge_requests_total{result="ok"} 5.0' in text
    assert "grpojob_judge_scored_total 20.0" in text and "grpojob_judge_queue_depth 0.0" in text
    sizes = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("grpojob_judge_batch_size_sum")]
    count = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("grpojob_judge_batch_size_count")]
    assert sizes == [20.0] and count[0] >= 3  # never more than maxBatchSize 8 a pass
    await scorer.judges["words"].close()


@pytest.mark.parametrize("policy", ["skip", "zero", "fail"])
async def test_each_failure_policy_when_the_judge_is_down(policy, reward_model, monkeypatch, tmp_path):
    from grpojob.local.processes import free_port

    job = _job(reward_model, onFailure=policy, retries=1, timeoutSeconds=1.0, startupTimeoutSeconds=1.0)
    scorer = _scorer(job, monkeypatch, tmp_path, [f"http://127.0.0.1:{free_port()}"])  # nothing listens
    client = scorer.judges["words"]
    client._ready = True  # it was up, then went away: the request's own retries decide
    group = _group([" dog", " xq"])
    if policy == "skip":
        with pytest.raises(GroupSkipped, match="could not score after 2 attempts"):
            await scorer.score_group(group)
    elif policy == "zero":
        await scorer.score_group(group)
        assert group.rewards == [0.0, 0.0]
    else:
        with pytest.raises(RewardError, match=r"spec.rewards\[0\] \(judge 'words', onFailure fail\)"):
            await scorer.score_group(group)
    assert client.failures == 1
    await client.close()


async def test_a_judge_that_never_becomes_ready_is_said(reward_model, monkeypatch, tmp_path):
    from grpojob.local.processes import free_port

    job = _job(reward_model, onFailure="fail", startupTimeoutSeconds=1.0)
    scorer = _scorer(job, monkeypatch, tmp_path, [f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(RewardError, match="not ready after 1 s"):
        await scorer.score_group(_group([" dog"]))
    await scorer.judges["words"].close()
