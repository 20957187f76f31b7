"""The trainer leader endpoint: /healthz, /status (TrainerStatus), /metrics, POST /suspend; only
/healthz (and /metrics, unless the job locks it) answers without the job's token."""
import json
import urllib.error
import urllib.request

import pytest

from grpojob.api.status import TrainerStatus
from grpojob import auth as authmod
from grpojob.auth import Auth
from grpojob.metrics_names import TRAINER
from grpojob.leader.server import LeaderServer, StatusBoard


TOKEN = "the-trainers-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def serve(metrics_auth: bool = False):
    board = StatusBoard(total_steps=10)
    return board, LeaderServer(board, "127.0.0.1", 0, Auth(TOKEN, metrics=metrics_auth)).start()


@pytest.fixture
def served():
    board, server = serve()
    try:
        yield board, f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _get(url, headers=BEARER):
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.status, r.read().decode()


def _refused(url, method="GET", headers=None):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers or {})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    return e.value.code, e.value.read(), e.value.headers.get("WWW-Authenticate")


def test_status_metrics_and_suspend(served):
    board, base = served
    assert _get(base + "/healthz")[0] == 200
    status = TrainerStatus.model_validate(json.loads(_get(base + "/status")[1]))
    assert (status.phase, status.total_steps) == ("starting", 10)

    board.observe({"step": 3, "policy_version": 3, "reward_mean": 0.5, "reward_std": 0.1,
                   "rewards": {"toy": 0.5}, "rewards_std": {"toy": 0.1}, "loss": 0.01, "kl": None,
                   "stage_seconds": {"generate": 0.2, "train": 0.1}, "step_seconds": 0.4, "published": True,
                   "sync_bytes": 4096})
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
    assert "grpojob_weight_sync_bytes_total 4096.0" in text  # what was pushed (LoRA: the adapter alone)
    for m in TRAINER:
        assert m.name in text

    assert not board.suspend_requested.is_set()
    req = urllib.request.Request(base + "/suspend", method="POST", data=b"", headers=BEARER)
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
        LeaderServer(StatusBoard(), "127.0.0.1", port, Auth(TOKEN))


def test_without_the_token_nothing_but_health_and_metrics_answers(served, caplog, monkeypatch):
    monkeypatch.setattr(authmod, "refused", authmod._RefusalLog())  # no window left by another test
    board, base = served
    for path, method in (("/status", "GET"), ("/suspend", "POST"), ("/nope", "GET"), ("/nope", "POST")):
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            assert _refused(base + path, method, headers) == (401, b"unauthorized", "Bearer"), (path, headers)
    assert not board.suspend_requested.is_set(), "a refused /suspend must not suspend"
    assert _get(base + "/healthz", headers={})[0] == 200
    assert _get(base + "/metrics", headers={})[0] == 200
    assert "refused GET /status from 127.0.0.1: no token" in caplog.text and TOKEN not in caplog.text


def test_a_job_may_lock_its_metrics_too():
    _, server = serve(metrics_auth=True)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _refused(base + "/metrics")[:2] == (401, b"unauthorized")
        code, text = _get(base + "/metrics")
        assert code == 200 and "grpojob_trainer_total_steps 10.0" in text
        assert _get(base + "/healthz", headers={})[0] == 200
    finally:
        server.stop()


def test_peak_memory_per_stage_in_status_and_metrics(served):
    """The step record's peaks per stage: /status stageMemory and the two gauges, labelled by
    stage; a stage the next step did not measure (no GPU: no device peaks) has no sample."""
    from grpojob.leader.record import StepRecord

    board, base = served
    gib = 2**30
    first = StepRecord(step=1, policy_version=1, learning_rate=1e-3,
                       stage_host_peak_bytes={"generate": 2 * gib, "train": 3 * gib, "checkpoint": 4 * gib},
                       stage_device_peak_bytes={"train": 5 * gib})
    board.observe(first.to_json())
    board.update(phase="running", **first.status_fields())
    doc = json.loads(_get(base + "/status")[1])
    assert doc["stageMemory"]["train"] == {"hostPeakBytes": 3 * gib, "devicePeakBytes": 5 * gib}
    assert doc["stageMemory"]["checkpoint"] == {"hostPeakBytes": 4 * gib}
    assert _memory_samples(_get(base + "/metrics")[1]) == {
        ("grpojob_stage_host_memory_peak_bytes", "generate"): 2 * gib,
        ("grpojob_stage_host_memory_peak_bytes", "train"): 3 * gib,
        ("grpojob_stage_host_memory_peak_bytes", "checkpoint"): 4 * gib,
        ("grpojob_stage_device_memory_peak_bytes", "train"): 5 * gib}
    second = StepRecord(step=2, policy_version=2, learning_rate=1e-3, stage_host_peak_bytes={"train": gib})
    board.observe(second.to_json())
    assert _memory_samples(_get(base + "/metrics")[1]) == {("grpojob_stage_host_memory_peak_bytes", "train"): gib}


def _memory_samples(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, s.labels["stage"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if "memory_peak" in s.name}
