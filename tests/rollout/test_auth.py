"""Only the job's own processes may use a rollout server (issue 15): every endpoint but the
kubelet's probes (and /metrics, unless the job asks) needs the job's token as a bearer token;
the OpenAI endpoints take it as the API key. Real hf server processes."""
from __future__ import annotations

import asyncio
import re
import urllib.request

import openai
import pytest

from grpojob.auth import ENV_METRICS_AUTH
from grpojob.leader.rollout_client import RolloutClient, RolloutError
from grpojob.contracts.rollout import SamplingParams

from .harness import TOKEN, RolloutProcess, http, make_job, write_config

PROTECTED = [("GET", "/info", None), ("GET", "/v1/models", None),
             ("POST", "/generate", {"prompt_ids": [5, 6], "n": 1}),
             ("POST", "/v1/completions", {"prompt": "1 + 1 =", "max_tokens": 2}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
             ("GET", "/no-such-path", None)]  # refused before routing: no way to probe what exists


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("auth")
    config = write_config(make_job(tiny_dir), tmp / "job.json")
    plain = RolloutProcess(config, tmp, replica="open-metrics").start()
    locked = RolloutProcess(config, tmp, replica="locked-metrics", env={ENV_METRICS_AUTH: "true"}).start()
    try:
        plain.wait_ready()
        locked.wait_ready()
        yield plain, locked
    finally:
        plain.stop()
        locked.stop()


def raw(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("method, path, body", PROTECTED, ids=[p for _, p, _ in PROTECTED])
def test_a_request_without_the_token_is_refused_and_says_nothing_more(servers, method, path, body):
    srv = servers[0]
    data = None if body is None else b'{"prompt_ids": [5, 6]}'
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"X-Api-Key": TOKEN}):
        code, text = raw(srv.url + path, method, data, {"Content-Type": "application/json", **headers})
        assert (code, text) == (401, b"unauthorized"), headers
    code, doc = http(srv.url + path, body)  # the harness sends the job's token
    assert code == (404 if path == "/no-such-path" else 200), doc


def test_probes_and_metrics_stay_open_and_a_job_may_lock_metrics(servers):
    plain, locked = servers
    for srv in servers:
        assert raw(srv.url + "/healthz")[0] == 200 and raw(srv.url + "/readyz")[0] == 200
    code, text = raw(plain.url + "/metrics")
    assert code == 200 and b"grpojob_rollout_weight_version" in text
    assert raw(locked.url + "/metrics") == (401, b"unauthorized")
    code, text = raw(locked.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert code == 200 and b"grpojob_rollout_weight_version" in text


def test_the_openai_client_uses_the_token_as_its_api_key(servers, tokenizer):
    srv = servers[0]
    ok = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0)
    assert ok.completions.create(model="m", prompt="1 + 1 =", max_tokens=2).choices[0].text is not None
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-not-this-job", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_a_trainer_with_another_token_fails_fast_and_says_why(servers):
    client = RolloutClient([servers[0].url], token="another-jobs-token", timeout=60)

    async def call():
        try:
            return await client.generate([5, 6], 1, SamplingParams(max_tokens=2))
        finally:
            await client.close()
    with pytest.raises(RolloutError, match=r"refused this job's token \(HTTP 401\)"):
        asyncio.run(call())


def test_refusals_are_logged_with_the_callers_address_never_the_token(servers):
    """One line per caller per 10 s (grpojob.auth), then a count of the refusals in between."""
    srv = servers[0]
    raw(srv.url + "/generate", "POST", b"{}", {"Authorization": "Bearer guess"})
    log = srv.log_path.read_text()
    assert re.search(r"WARNING grpojob.auth: refused (GET|POST) /\S+ from 127\.0\.0\.1: (no|wrong) token", log)
    assert TOKEN not in log and "guess" not in log
