"""The trainer's side of spec.rollout.autoscale: its last step's wait share, idle share and groups in
flight in /status (`pipeline`, what the operator decides on) and in /metrics (what an HPA or KEDA
scales on)."""
import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from grpojob.api.status import TrainerStatus
from grpojob.auth import Auth
from grpojob.leader.record import StepRecord
from grpojob.leader.server import LeaderServer, StatusBoard


def test_the_step_record_carries_the_wait_share():
    assert StepRecord(step=1, policy_version=1, learning_rate=1e-3, wait_seconds=3.0, step_seconds=4.0).wait_fraction == 0.75
    assert StepRecord(step=1, policy_version=1, learning_rate=1e-3).wait_fraction is None  # no step time: unknown


def test_status_and_metrics_show_the_signals():
    board = StatusBoard(total_steps=10)
    server = LeaderServer(board, "127.0.0.1", 0, Auth("t")).start()
    try:
        rec = StepRecord(step=3, policy_version=3, learning_rate=1e-3, wait_seconds=1.5, step_seconds=2.0,
                         rollout_idle_fraction=0.125, groups_in_flight=4, policy_staleness=0.5)
        board.observe(rec.to_json())
        board.update(phase="running", **rec.status_fields())
        base = f"http://127.0.0.1:{server.port}"
        req = urllib.request.Request(base + "/status", headers={"Authorization": "Bearer t"})
        doc = json.loads(urllib.request.urlopen(req, timeout=10).read())
        assert doc["pipeline"] == {"step": 3, "waitSeconds": 1.5, "stepSeconds": 2.0, "waitFraction": 0.75,
                                   "rolloutIdleFraction": 0.125, "groupsInFlight": 4, "policyStaleness": 0.5}
        assert TrainerStatus.model_validate(doc).pipeline.wait_fraction == 0.75  # what the operator reads
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples["grpojob_trainer_wait_fraction"] == 0.75
        assert samples["grpojob_rollout_idle_fraction"] == 0.125 and samples["grpojob_groups_in_flight"] == 4
    finally:
        server.stop()
