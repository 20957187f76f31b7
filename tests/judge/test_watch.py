"""The trainer's view of its judges (grpojob.rewards.judge_watch): its /metrics series per judge,
scraped from the trainer leader's endpoint, and the bound on onFailure skip: a judge that stays down
fails the step with its own error instead of having its groups skipped for ever.

The judge here is a stand-in HTTP server (no model): the test decides whether it answers, fails
(503) or holds a request, so each path is seen exactly."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from grpojob.api import check
from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.auth import ENV_TOKEN_FILE, Auth
from grpojob.data import PromptSettings, PromptStream
from grpojob.leader import workflows
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.local.processes import free_port
from grpojob.plan import ENV_JUDGE_URLS
from grpojob.rewards import RewardError, RewardScorer
from grpojob.rewards.judges import GroupSkipped

from ..rollout.harness import load_model, make_job
from ..rollout.inprocess import ModelGenerator
from .test_spec import _doc

TOKEN = "w" * 43


class StandIn:
    """A judge's HTTP face: /readyz 200, /score the completions' lengths, or 503 while `down`;
    while `hold` is set a /score waits for it to clear."""

    def __init__(self) -> None:
        self.down = False
        self.hold = asyncio.Event()
        self.hold.set()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _score(self, request: web.Request) -> web.Response:
        await self.hold.wait()
        if self.down:
            return web.json_response({"error": "model not loaded"}, status=503)
        items = (await request.json())["items"]
        return web.json_response({"scores": [len(i["completion"]) / 10 for i in items]})

    async def __aenter__(self) -> "StandIn":
        app = web.Application()
        app.router.add_get("/readyz", lambda _: web.json_response({"ready": True}))
        app.router.add_post("/score", self._score)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.hold.set()
        await self._runner.cleanup()


def _scorer(name: str, urls: list[str], monkeypatch, tmp_path, **judge) -> RewardScorer:
    """A scorer of one judge named `name` (the judges' series are per process: each test its own name)."""
    job, errors = check(_doc([{"judge": name}], [{"name": name, "model": "/m", "template": "{completion}", **judge}]))
    assert not errors, errors
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "token"))
    monkeypatch.setenv(ENV_JUDGE_URLS, json.dumps({name: urls}))
    return RewardScorer(job.spec, tokenizer=None)


def _group(texts: list[str]) -> Group:
    return Group(sample=Sample(index=0, prompt="list animals :", prompt_ids=[1], row={"answer": "animals"}),
                 completions=[Completion(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], policy_version=0, text=t)
                              for t in texts])


def _scrape(port: int, judge: str) -> dict[tuple, float]:
    """The trainer leader's /metrics, the samples of one judge: (name, other labels) -> value."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=Auth(TOKEN).headers())
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    return {(s.name, *sorted((k, v) for k, v in s.labels.items() if k != "judge")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("judge") == judge}


async def test_the_trainer_leaders_metrics_show_its_judges(monkeypatch, tmp_path):
    board = StatusBoard(10)
    server = LeaderServer(board, "127.0.0.1", 0, Auth(TOKEN)).start()
    try:
        async with StandIn() as judge:
            scorer = _scorer("seen", [judge.url], monkeypatch, tmp_path, retries=1, onFailure="skip")
            before = _scrape(server.port, "seen")  # the judge is known, nothing sent yet: true zeros
            assert before[("grpojob_trainer_judge_requests_in_flight",)] == 0
            assert before[("grpojob_trainer_judge_request_seconds_count",)] == 0
            assert before[("grpojob_trainer_judge_unscored_groups_total",)] == 0
            groups = [_group([" dog", " cat cat"]) for _ in range(3)]
            await asyncio.gather(*(scorer.score_group(g) for g in groups))
            assert groups[0].rewards == [0.4, 0.8]

            judge.hold.clear()  # two requests in flight, held by the judge
            held = [asyncio.create_task(scorer.score_group(_group([" x"]))) for _ in range(2)]
            await asyncio.sleep(0.3)
            seen = await asyncio.to_thread(_scrape, server.port, "seen")
            assert seen[("grpojob_trainer_judge_requests_in_flight",)] == 2
            judge.hold.set()
            await asyncio.gather(*held)

            judge.down = True  # 503: two attempts (retries 1), then the group is skipped
            with pytest.raises(GroupSkipped):
                await scorer.score_group(_group([" dog"]))
            seen = await asyncio.to_thread(_scrape, server.port, "seen")
            await scorer.judges["seen"].close()
    finally:
        server.stop()
    assert seen[("grpojob_trainer_judge_requests_in_flight",)] == 0
    assert seen[("grpojob_trainer_judge_request_seconds_count",)] == 5  # the answered requests
    assert 0.2 < seen[("grpojob_trainer_judge_request_seconds_sum",)] < 30  # the held ones waited 0.3 s
    assert seen[("grpojob_trainer_judge_failures_total", ("reason", "server_error"))] == 2
    assert seen[("grpojob_trainer_judge_unscored_groups_total",)] == 1
    assert not any(k[0] == "grpojob_trainer_judge_failures_total" and k[1][1] != "server_error" for k in seen)


async def test_skip_gives_up_on_a_judge_that_stays_down(monkeypatch, tmp_path):
    """onFailure skip: the first unscored groups are skipped; once the judge has scored nothing for
    its startupTimeoutSeconds (and 2 groups at least) the step fails with the judge's own error."""
    port = free_port()  # nothing listens: the judge went away
    scorer = _scorer("gone", [f"http://127.0.0.1:{port}"], monkeypatch, tmp_path, retries=0, onFailure="skip",
                     startupTimeoutSeconds=1.0)
    client = scorer.judges["gone"]
    client._ready = True  # it was up, then went away
    started, skipped = time.monotonic(), 0
    with pytest.raises(RewardError) as e:
        while time.monotonic() - started < 10:
            try:
                await scorer.score_group(_group([" dog"]))
            except GroupSkipped:
                skipped += 1
                await asyncio.sleep(0.2)
    took = time.monotonic() - started
    assert 1.0 <= took < 3 and skipped >= 2
    message = str(e.value)
    assert message.startswith("spec.rewards[0] (judge 'gone', onFailure skip): judge 'gone' (spec.judges[0]) has "
                              "scored no group for 1 s"), message
    assert "startupTimeoutSeconds (1 s): it is down" in message and "ClientConnectorError" in message
    await client.close()


async def test_a_judge_that_comes_back_starts_the_count_again(monkeypatch, tmp_path):
    async with StandIn() as judge:
        scorer = _scorer("flaky", [judge.url], monkeypatch, tmp_path, retries=0, onFailure="skip",
                         startupTimeoutSeconds=1.0)
        for _ in range(3):  # down 0.7 s at a time, answering in between: never down for 1 s
            judge.down = True
            for _ in range(2):
                with pytest.raises(GroupSkipped):
                    await scorer.score_group(_group([" dog"]))
                await asyncio.sleep(0.35)
            judge.down = False
            await scorer.score_group(_group([" dog"]))
        await scorer.judges["flaky"].close()


def test_the_step_fails_with_the_judges_error_when_it_stays_down(tiny_dir, tokenizer, monkeypatch, tmp_path):
    """In the rollout manager: skipped groups are generated again while the judge may come back;
    once it counts as down, the step fails with its error (the trainer exits with it, and restarts
    from its checkpoint as with onFailure fail), instead of waiting for ever."""
    job = make_job(tiny_dir, algorithm={"groupSize": 2}, rollout={"sampling": {"maxTokens": 2}},
                   dataset={"factory": "toy", "args": {"size": 40}, "maxPromptLength": 32},
                   training={"promptsPerStep": 2, "steps": 5}, rewards=[{"judge": "stays"}],
                   judges=[{"name": "stays", "model": "/m", "retries": 0, "startupTimeoutSeconds": 1.0}])
    monkeypatch.setenv(ENV_JUDGE_URLS, json.dumps({"stays": [f"http://127.0.0.1:{free_port()}"]}))
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    monkeypatch.setenv(ENV_TOKEN_FILE, str(tmp_path / "token"))
    scorer = RewardScorer(job.spec, tokenizer)
    scorer.judges["stays"]._ready = True  # it was up, then went away
    started = time.monotonic()
    with RolloutManager(ModelGenerator(load_model(tiny_dir), tokenizer), workflows.build(job.spec, tokenizer),
                        scorer, PromptStream(PromptSettings.of(job.spec), tokenizer), Pipeline.from_spec(job.spec)) as m:
        with pytest.raises(RewardError, match=r"judge 'stays' \(spec.judges\[0\]\) has scored no group for \d+ s"):
            m.next_step()
    assert time.monotonic() - started < 30
