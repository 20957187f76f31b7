"""A rollout server that gets SIGTERM (scaled down, its pod deleted) drains (grpojob.rollout.process.drain):
the request it is generating finishes there and is answered, a new request gets 503 `draining` (which
the trainer's client takes as no failure and sends to another server), /readyz turns unready, and
the process exits 0 saying what it finished and that nothing was cut off. The server is the paced
engine of examples/plugins/paced (the hf engine holding each completion for a set time), so a
request is surely in flight when the signal comes."""
from __future__ import annotations

import asyncio
import logging
import signal
import threading

from grpojob.leader.rollout_client import RolloutClient
from grpojob.contracts.rollout import SamplingParams

from .harness import REPO, TOKEN, RolloutProcess, http, make_job, wait_for, write_config

PACED = f"{REPO / 'examples' / 'plugins' / 'paced' / 'paced_engine.py'}:PacedEngine"
SECONDS_PER_COMPLETION = 1.0  # a request of n=3 holds the server 3 s: long enough to signal it meanwhile


def test_a_stopping_server_finishes_its_requests_and_sends_new_ones_elsewhere(tmp_path, tiny_dir, caplog):
    job = make_job(tiny_dir, rollout={"engineArgs": {"pace": [{"secondsPerCompletion": SECONDS_PER_COMPLETION}]}})
    config = write_config(job, tmp_path / "job.json")
    leaving = RolloutProcess(config, tmp_path, replica="leaving", backend=PACED).start()
    other = RolloutProcess(config, tmp_path, replica="other").start()
    try:
        leaving.wait_ready()
        other.wait_ready()
        answered: list[tuple[int, dict]] = []
        inflight = threading.Thread(target=lambda: answered.append(
            http(leaving.url + "/generate", {"prompt_ids": [5, 6, 7], "n": 3, "sampling": {"max_tokens": 4}})))
        inflight.start()
        wait_for(lambda: leaving.status("/info")[1].get("in_flight") == 1, 30, "the request in flight")
        leaving.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: leaving.status("/readyz")[0] == 503, 10, "/readyz turning unready", proc=leaving.proc)
        status, body = http(leaving.url + "/generate", {"prompt_ids": [5, 6, 8], "n": 1})
        assert (status, body.get("draining")) == (503, True), body
        assert "draining" in body["error"]
        # the trainer's client: the leaving server is skipped without a failure
        client = RolloutClient([leaving.url, other.url], token=TOKEN)

        async def run():
            try:
                return await asyncio.gather(*(client.generate([5, 6, 9 + i], 2, SamplingParams(max_tokens=4))
                                              for i in range(2)))
            finally:
                await client.close()
        with caplog.at_level(logging.WARNING, logger="grpojob.leader.rollout_client"):
            results = asyncio.run(run())
        assert [len(r) for r in results] == [2, 2]
        assert client.health() is None
        assert not [r for r in caplog.records if "fails" in r.getMessage()], caplog.text
        inflight.join(30)
        assert answered and answered[0][0] == 200, answered
        assert len(answered[0][1]["completions"]) == 3 and answered[0][1]["replica"] == "leaving"
        assert leaving.proc.wait(30) == 0, leaving.tail()
    finally:
        leaving.stop()
        other.stop()
    log = leaving.tail()
    assert "draining 1 requests in flight" in log, log
    assert "1 requests finished" in log and "0 cut off" in log, log
