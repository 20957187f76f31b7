"""A rollout server whose engine breaks (issue 21): not ready with the engine's error, 503 for the
requests (never a hang), plugins.ENGINE_FAILED and the error as its termination message, exit 1
within seconds (grpojob.rollout.process)."""
from __future__ import annotations

import threading
import time

from grpojob import failures
from grpojob.api import plugins

from tests.local import faulty_engines

from .harness import RolloutProcess, http, make_job, write_config


def test_an_engine_failure_turns_the_server_unready_and_ends_it_with_a_termination_message(tmp_path, tiny_dir):
    termination = tmp_path / "termination-log"  # the kubelet's /dev/termination-log, here a file
    srv = RolloutProcess(write_config(make_job(tiny_dir), tmp_path / "job.json"), tmp_path, replica="broken",
                         backend=f"{faulty_engines.__file__}:FailsAlways",
                         env={failures.ENV_TERMINATION_LOG: str(termination)}).start()
    try:
        srv.wait_ready()  # standalone: ready once the engine is up
        seen: list[tuple[int, dict]] = []
        polling = threading.Event()

        def poll():  # /readyz all along, as a kubelet's probe would
            while not polling.is_set():
                seen.append(srv.status("/readyz"))
                time.sleep(0.05)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.monotonic()
        status, body = http(srv.url + "/generate", {"prompt_ids": [5, 6, 7], "n": 2})
        assert status == 503, body  # not a hang, not a 500 traceback: the engine's error
        assert body["error"] == f"hf engine failed: RuntimeError: {faulty_engines.ERROR}"
        assert srv.proc.wait(15) == 1, srv.tail()
        exited = time.monotonic() - t0
        polling.set()
        poller.join(5)
    finally:
        srv.stop()
    unready = [b for s, b in seen if s == 503]
    assert unready and unready[0]["reason"] == body["error"], seen[-5:]
    assert exited < 10
    assert termination.read_text() == plugins.failure_message(
        plugins.ENGINE_FAILED, [f"rollout server broken: hf engine failed: RuntimeError: {faulty_engines.ERROR}"])
    assert plugins.parse_failure(termination.read_text()) is None  # restarted, not the job's failure
