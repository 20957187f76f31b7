"""RolloutClient against real hf servers: least-loaded spreading, retry on another server,
clear errors and timeouts. And the failover story end to end: a server killed mid-run, the
step completes on the other one, the restarted server re-joins at the current version."""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from grpojob.leader.rollout_client import RolloutClient, RolloutError
from grpojob.data import PromptSettings, PromptStream
from grpojob.rewards import RewardScorer
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.contracts.rollout import SamplingParams
from grpojob.leader.workflows import SingleTurn
from grpojob.sync.publisher import WeightPublisher

from .harness import (PROMPTS, TOKEN, RolloutProcess, free_port, greedy, http, load_model, make_job, perturb,
                      wait_for, write_config)

pytestmark = pytest.mark.serial  # its slow tests are timing-sensitive: CI runs them alone

SAMPLING = SamplingParams(temperature=1.0, max_tokens=6)


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("client")
    config = write_config(make_job(tiny_dir), tmp / "job.json")
    servers = [RolloutProcess(config, tmp, replica=f"c{i}").start() for i in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def _requests_ok(srv) -> float:
    import urllib.request
    text = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith('grpojob_rollout_requests_total{result="ok"}'):
            return float(line.split()[1])
    return 0.0


def test_concurrent_requests_go_to_the_least_loaded_server(two_servers):
    client = RolloutClient([s.url for s in two_servers], token=TOKEN)
    before = [_requests_ok(s) for s in two_servers]

    async def run():
        try:
            return await asyncio.gather(*(client.generate([5, 6, 7 + i], 4, SAMPLING) for i in range(8)))
        finally:
            await client.close()
    results = asyncio.run(run())
    assert all(len(r) == 4 and r[0].prompt_ids == [5, 6, 7 + i] for i, r in enumerate(results))
    assert [_requests_ok(s) - b for s, b in zip(two_servers, before)] == [4, 4]


def test_a_dead_server_is_skipped_and_its_requests_retried(two_servers, caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    client = RolloutClient([dead, two_servers[0].url], token=TOKEN, cooldown=60)

    async def run():
        try:
            return await asyncio.gather(*(client.generate([5, 6], 2, SAMPLING) for _ in range(4)))
        finally:
            await client.close()
    with caplog.at_level(logging.WARNING, logger="grpojob.leader.rollout_client"):
        results = asyncio.run(run())
    assert all(len(r) == 2 for r in results)
    # Said once (not once per request), with why; health() names it until it answers again.
    assert caplog.text.count(f"rollout server {dead} fails: ClientConnectorError") == 1, caplog.text
    assert client.health().startswith(f"rollout servers failing: {dead}: ClientConnectorError")


def test_errors_are_clear_and_bounded(two_servers):
    srv = two_servers[0]

    async def call(client, **kw):
        try:
            return await client.generate([5, 6], 1, kw.pop("sampling", SAMPLING), **kw)
        finally:
            await client.close()
    with pytest.raises(RolloutError, match=f"rollout server {srv.url} rejected the request: .*context length"):
        asyncio.run(call(RolloutClient([srv.url], token=TOKEN), sampling=SamplingParams(max_tokens=10 ** 6)))
    with pytest.raises(RolloutError, match="within 1 s .*no rollout server registered"):
        asyncio.run(call(RolloutClient([], token=TOKEN, timeout=1)))
    with pytest.raises(RolloutError, match="HTTP 409: replica c0 holds policy version 0, older than the required 5"):
        asyncio.run(call(RolloutClient([srv.url], token=TOKEN, timeout=1), min_version=5))


@pytest.mark.slow
def test_a_killed_server_fails_over_and_rejoins_at_the_current_version(tmp_path, tiny_dir, tokenizer):
    job = make_job(tiny_dir, algorithm={"groupSize": 4}, rollout={"sampling": {"maxTokens": 128}, "maxModelLen": 256},
                   training={"promptsPerStep": 8, "steps": 10})
    config = write_config(job, tmp_path / "job.json")
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", heartbeat_timeout=2,
                          token=TOKEN)
    addr = f"127.0.0.1:{pub.port}"
    servers = [RolloutProcess(config, tmp_path, replica=f"r{i}", sync_addr=addr).start() for i in range(2)]
    client = RolloutClient(pub.rollout_addresses, token=TOKEN, timeout=120)
    spec = job.spec
    manager = None
    try:
        for s in servers:
            s.wait_ready()
        wait_for(lambda: len(pub.rollout_addresses()) == 2, 30, "both servers registered")
        trainer = perturb(load_model(tiny_dir), seed=1)
        assert pub.push(trainer.state_dict().items(), version=1)["servers"] == 2
        # Told of version 1 only after step 1, the manager starts step 2 exactly then (told at
        # once, it would generate both steps together and step 2 could be done before r0 dies).
        manager = RolloutManager(client, SingleTurn(spec, tokenizer), RewardScorer(spec, tokenizer),
                                 PromptStream(PromptSettings.of(spec), tokenizer), Pipeline.from_spec(spec), published=0)
        assert len(manager.next_step().groups) == 8
        manager.set_published(1)

        # Step 2: r0 is killed while it generates for this step.
        victim = servers[0]
        result: dict = {}
        step = threading.Thread(target=lambda: result.update(step=manager.next_step()))
        step.start()
        wait_for(lambda: client.loads().get(victim.url, 0) > 0, 30, "requests in flight at r0", interval=0.01)
        victim.kill()
        step.join(120)
        groups = result["step"].groups
        assert len(groups) == 8 and all(len(g.completions) == 4 for g in groups)
        assert {c.policy_version for g in groups for c in g.completions} == {1}

        # The trainer goes on: r0 is dropped (no heartbeat), version 2 reaches r1 only.
        wait_for(lambda: pub.rollout_addresses() == [servers[1].url], 30, "r0 dropped")
        trainer = perturb(load_model(tiny_dir), seed=2)
        stats = pub.push(trainer.state_dict().items(), version=2)
        assert stats["servers"] == 1
        manager.set_published(2)

        # r0 comes back (same name, same port): it re-joins and is brought to version 2 first.
        victim.start()
        victim.wait_ready()
        wait_for(lambda: len(pub.rollout_addresses()) == 2, 30, "r0 re-joined")
        assert http(victim.url + "/info")[1]["policy_version"] == 2
        for text in PROMPTS:
            p = tokenizer.encode(text)
            out = victim.generate(p, temperature=0, max_tokens=8)
            assert out["completions"][0]["completion_ids"] == greedy(trainer, tokenizer, p, 8)[0]
            assert out["policy_version"] == 2
        groups = manager.next_step().groups
        assert {c.policy_version for g in groups for c in g.completions} == {2}
    finally:
        if manager is not None:
            manager.close()
        for s in servers:
            s.stop()
        pub.close()


def test_a_request_on_a_server_dropped_meanwhile_goes_to_another_at_once(two_servers):
    """Issue 42: a rollout server frozen (SIGSTOP) held its requests until request_timeout, after
    the trainer had dropped it for missing heartbeats, and the step failed. A request whose server
    leaves the list is abandoned and sent to another server."""
    async def run():
        hung = await asyncio.start_server(lambda r, w: asyncio.sleep(3600), "127.0.0.1", 0)  # never answers
        listed = [f"http://127.0.0.1:{hung.sockets[0].getsockname()[1]}"]
        client = RolloutClient(lambda: listed, token=TOKEN, request_timeout=600, timeout=600)
        try:
            task = asyncio.ensure_future(client.generate([5, 6, 7], 2, SAMPLING))
            await asyncio.sleep(1.5)
            assert not task.done()
            listed[:] = [two_servers[0].url]  # the trainer dropped the hung server
            dropped = time.monotonic()
            out = await asyncio.wait_for(task, 60)
            return out, time.monotonic() - dropped, client.health()
        finally:
            await client.close()
            hung.close()
    out, took, health = asyncio.run(run())
    assert len(out) == 2 and out[0].prompt_ids == [5, 6, 7]
    assert took < 30, f"{took:.1f} s after the drop, with request_timeout 600"
    assert "left the rollout servers" in (health or ""), health


def test_a_request_on_a_server_that_left_to_stop_is_answered_there_not_sent_again():
    """A server scaled down leaves the weight-sync group, then finishes the requests it has
    (rollout.process.drain). The client waits for those (the publisher lists the server as
    draining) instead of sending them to another server too: on a 2-core machine both servers
    generating the same requests made the step after a ScaleUpNoGain take 6.2 s instead of 0.5.
    A server that is dropped (dead or hung) is still left at once (the test above)."""
    from aiohttp import web

    async def run(draining: bool):
        hits = {"slow": 0, "other": 0}

        def handler(name: str, delay: float):
            async def generate(request):
                hits[name] += 1
                await asyncio.sleep(delay)
                return web.json_response({"completions": [
                    {"completion_ids": [1], "logprobs": [-0.5], "policy_version": 0, "finish_reason": "length",
                     "text": name}]})
            return generate

        runners, urls = [], {}
        for name, delay in (("slow", 2.5), ("other", 0.0)):
            app = web.Application()
            app.router.add_post("/generate", handler(name, delay))
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
        listed, left = [urls["slow"]], []
        client = RolloutClient(lambda: listed, token=TOKEN, draining=lambda: left, request_timeout=60, timeout=60)
        try:
            task = asyncio.ensure_future(client.generate([5, 6, 7], 1, SAMPLING))
            await asyncio.sleep(0.5)
            listed[:] = [urls["other"]]  # the slow server left the list...
            if draining:
                left.append(urls["slow"])  # ...to stop: it finishes what it has
            out = await asyncio.wait_for(task, 30)
            return out[0].text, hits, client.health()
        finally:
            await client.close()
            for r in runners:
                await r.cleanup()

    text, hits, health = asyncio.run(run(draining=True))
    assert (text, hits) == ("slow", {"slow": 1, "other": 0}) and health is None, (text, hits, health)
    text, hits, health = asyncio.run(run(draining=False))  # dropped instead: sent to the other at once
    assert (text, hits) == ("other", {"slow": 1, "other": 1}), (text, hits)
