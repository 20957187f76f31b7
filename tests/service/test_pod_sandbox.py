"""A GRPOJob in mode service as the operator renders it: its trainer and rollout pods run in the
acted-out pod sandbox (read-only root, uid 10001, no capabilities: tests/helpers/pod_sandbox.py; no
cluster here), and the nexrl-remote example's loop, from outside the pods with the job's token (as
from spec.network.agentNamespaces), trains through the training API; the operator's suspend then
checkpoints onto the pod's volume and the trainer exits 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from grpojob.client import ServiceClient
from grpojob.local.runner import ENDPOINTS_FILE
from grpojob_operator import names as n
from tests.operator_k8s.test_pod_sandbox import SECRETS, cluster_job, run, stop  # noqa: F401 - the fixture
from tests.helpers import pod_sandbox, statefulset

from .test_nexrl_remote import EXAMPLE

ok, why = pod_sandbox.available()
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")]


def test_a_service_job_trains_from_outside_its_pods(cluster_job, tmp_path, tiny_dir, monkeypatch):  # noqa: F811
    kids, claims, network = cluster_job
    config = json.loads(kids["ConfigMap"]["data"]["grpojob.json"])
    config["spec"]["mode"] = "service"
    kids["ConfigMap"]["data"]["grpojob.json"] = json.dumps(config)
    port = config["spec"]["trainer"]["port"]
    # The "image" is this checkout (the shared interpreter's editable install may be another one).
    network = {**network, "PYTHONPATH": f"{pod_sandbox.REPO}/runtime:{pod_sandbox.REPO}/operator"}
    rollout, rwork = run(kids, claims, network, tmp_path, "rollout")
    trainer, twork = run(kids, claims, network, tmp_path, "trainer")
    client = tmp_path / "client"  # what the user's loop holds: the trainer's address and the job's token
    client.mkdir()
    (client / ENDPOINTS_FILE).write_text(json.dumps({"trainer-0": f"http://127.0.0.1:{port}"}))
    (client / "token").write_text(SECRETS[n.token_name("t")]["token"])
    os.chmod(client / "token", 0o600)
    try:
        service = ServiceClient(f"http://127.0.0.1:{port}", SECRETS[n.token_name("t")]["token"])
        deadline = time.monotonic() + 300
        while True:  # until the trainer serves; fail at once if a pod died
            assert trainer.poll() is None and rollout.poll() is None, (twork / "log").read_text()[-3000:]
            try:
                assert service.wait_ready(timeout=1).ranks == 1
                break
            except TimeoutError:
                assert time.monotonic() < deadline, (twork / "log").read_text()[-3000:]
        loop = subprocess.run([sys.executable, str(EXAMPLE / "remote_trainer.py"), "--run-dir", str(client),
                               "--steps", "3", "--prompts-per-step", "4", "--tokenizer", str(tiny_dir)],
                              capture_output=True, text=True, timeout=420)
        tlog = (twork / "log").read_text()
        assert loop.returncode == 0, loop.stderr[-3000:] + "\ntrainer:\n" + tlog[-3000:]
        steps = [json.loads(line) for line in loop.stdout.splitlines() if line.startswith("{")]
        assert [s["policy_version"] for s in steps] == [1, 2, 3] and all(s["groups"] == 4 for s in steps)
        # the operator's suspend: checkpoint, then exit 0
        req = urllib.request.Request(f"http://127.0.0.1:{port}/suspend", method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {SECRETS[n.token_name('t')]['token']}"})
        urllib.request.urlopen(req, timeout=10).close()
        assert trainer.wait(60) == 0, (twork / "log").read_text()[-3000:]
    finally:
        stop(trainer)
        stop(rollout)
    # on trainer pod 0's checkpoint claim (from the StatefulSet's claim template)
    ckpt = claims[statefulset.claims(kids["StatefulSet"], 0)[0]["metadata"]["name"]] / "step-000003"
    assert ckpt.is_dir() and ckpt.stat().st_uid == n.RUNTIME_UID
    text = (twork / "log").read_text()
    assert "training service stopped" in text and "Read-only file system" not in text
