"""A policy version names one set of weights: the service never hands one out twice, even when it
is killed between an optim_step and the next checkpoint and resumes from that checkpoint (issue 33:
load_state gave v26, a sample was served at v26, and after a restart the next optim_step issued v26
again for other weights)."""
from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from grpojob.auth import Auth
from grpojob.leader.build import build
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.service.app import serve
from grpojob.service.versions import FILE
from tests.trainer.conftest import make_job

from .test_service import GOOD, TOKEN, call

pytestmark = pytest.mark.slow


def start(tiny_dir, ck):
    """A service over the checkpoints in `ck`, as a (re)started trainer pod runs it."""
    job = make_job(tiny_dir, mode="service", training={"microBatchTokens": 64})
    board, suspend = StatusBoard(), threading.Event()
    board.suspend_requested = suspend
    server = LeaderServer(board, "127.0.0.1", 0, Auth(TOKEN)).start()
    run = build(job, rollouts="inprocess", checkpoint_dir=str(ck), board=board, suspend=suspend)
    thread = threading.Thread(target=serve, args=(run, server), daemon=True)
    thread.start()
    for _ in range(600):
        if board.snapshot().get("phase") == "running":
            break
        threading.Event().wait(0.1)
    return run, server, suspend, thread


def step(server) -> int:
    assert call(server, "/forward_backward", {"data": [GOOD], "loss_fn": "importance_sampling"})[0] == 200
    code, doc = call(server, "/optim_step", {"adam_params": {"learning_rate": 1e-3}})
    assert code == 200, doc
    return int(doc["metrics"]["policy_version"])


def test_no_version_is_issued_twice_across_a_kill_and_a_load_state(tiny_dir, tmp_path):
    ck = tmp_path / "ck"
    first, server, _, _ = start(tiny_dir, ck)
    assert step(server) == 1
    code, saved = call(server, "/save_state", {"name": "mine"})
    assert code == 200
    issued = [step(server), step(server)]  # v2, v3: after the last checkpoint
    assert issued == [2, 3] and (ck / FILE).read_text().strip() == "3"
    # the trainer is killed here: nothing saved since step 1 (the first service is simply abandoned)
    second, server2, suspend2, thread2 = start(tiny_dir, ck)
    try:
        assert second.trainer.step == 1  # resumed from the checkpoint of step 1
        req = urllib.request.Request(f"http://127.0.0.1:{server2.port}/service/info",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            resumed = json.loads(r.read())["policy_version"]
        assert resumed > 3, "the resumed weights are labelled after every version issued"
        assert step(server2) == resumed + 1
        assert saved["name"] == "mine"
        code, loaded = call(server2, "/load_state", {"path": "mine"})  # the name it was saved under
        assert code == 200 and loaded["path"] == saved["path"]
        assert loaded["policy_version"] == resumed + 2  # going back in time: a new version
    finally:
        suspend2.set()
        thread2.join(60)
        server2.stop()
        server.stop()
