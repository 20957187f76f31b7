"""The trainer leader endpoint: /healthz, /status (TrainerStatus), /metrics, POST /suspend."""
import json
import urllib.error
import urllib.request

import pytest

from grpojob.api.status import TrainerStatus
from grpojob.metrics_names import TRAINER
from grpojob.trainer.server import LeaderServer, StatusBoard


@pytest.fixture
def served():
    board = StatusBoard(total_steps=10)
    server = LeaderServer(board, "127.0.0.1", 0).start()
    try:
        yield board, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


def test_status_metrics_and_suspend(served):
    board, base = served
    assert _get(base + "/healthz")[0] == 200
    status = TrainerStatus.model_validate(json.loads(_get(base + "/status")[1]))
    assert (status.phase, status.total_steps) == ("starting", 10)

    board.observe({"step": 3, "policy_version": 3, "reward_mean": 0.5, "reward_std": 0.1,
                   "rewards": {"toy": 0.5}, "rewards_std": {"toy": 0.1}, "loss": 0.01, "kl": None,
                   "stage_seconds": {"generate": 0.2, "train": 0.1}, "step_seconds": 0.4, "published": True})
    board.update(phase="running", step=3, policy_version=3, reward_mean=0.5, weights_in_sync=True)
    doc = json.loads(_get(base + "/status")[1])
    assert doc["phase"] == "running" and doc["step"] == 3 and doc["rewardMean"] == 0.5
    assert doc["weightsInSync"] is True and "kl" not in doc  # unset optionals are left out

    code, text = _get(base + "/metrics")
    assert code == 200
    assert "grpojob_trainer_step 3.0" in text
    assert 'grpojob_reward_mean{reward="toy"} 0.5' in text
    assert 'grpojob_stage_seconds_count{stage="generate"} 1.0' in text
    assert "grpojob_weight_sync_seconds_count 1.0" in text
    for m in TRAINER:
        assert m.name in text

    assert not board.suspend_requested.is_set()
    req = urllib.request.Request(base + "/suspend", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 202
    assert board.suspend_requested.is_set()
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(base + "/nope")
    assert e.value.code == 404


def test_port_in_use_is_a_clear_error(served):
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    with pytest.raises(OSError, match="GRPOJOB_TRAINER_PORT"):
        LeaderServer(StatusBoard(), "127.0.0.1", port)
