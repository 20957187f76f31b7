"""A colocated job's rendered trainer pod runs: its two containers (trainer and engine), started
as the kubelet would (tests/helpers/pod_sandbox.py: mount namespaces, the pod's user, read-only
root, no capabilities), share the pod's emptyDirs, so the engine reads the trainer's /dev/shm and
the weights go through shared memory; the engine sleeps through every step's training.

With GPUs in trainer.resources the pod has one container, which runs both processes
(grpojob.colocated_pod): the same run, started as that one container. The sandbox has no device
plugin, so the GPU limit is only rendered, and both processes compute on the CPU."""
from __future__ import annotations

import json
import shutil

import pytest

from grpojob import auth, plan
from grpojob.api import parse
from grpojob.local.processes import free_port
from grpojob_operator import children
from grpojob_operator import names as n
from tests.helpers import pod_sandbox, statefulset

from .conftest import PER_POD, job_manifest
from .test_pod_sandbox import SECRETS, stop, wait_completed

ok, why = pod_sandbox.available()
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")]


@pytest.mark.parametrize("gpus", [0, 1], ids=["two-containers", "one-container-with-gpus"])
def test_a_colocated_trainer_pod_trains_with_its_engine_through_shared_memory(tiny_dir, tmp_path, gpus):
    models = tmp_path / "models"
    shutil.copytree(tiny_dir, models / "tiny")
    for p in [models, *models.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    trainer_port = free_port()
    m = job_manifest("t", placement="colocated", model={"path": "/models/tiny", "volumeClaim": "models"},
                     training={"steps": 2, "promptsPerStep": 4, "microBatchTokens": 512},
                     trainer={"replicas": 1, "processesPerReplica": 1, "port": trainer_port,
                              **({"resources": {"limits": {"nvidia.com/gpu": gpus}}} if gpus else {})},
                     rollout={"replicas": 1, "backend": "hf", "port": free_port(), "sampling": {"maxTokens": 8}},
                     checkpoint={**PER_POD, "storage": "ephemeral"})
    kids = {o["kind"]: o for o in children.build(parse(m), namespace="ml")}
    assert "Deployment" not in kids
    pod = statefulset.pod_spec(kids["StatefulSet"], 0)
    containers = [c["name"] for c in pod["containers"]]
    assert containers == (["trainer"] if gpus else ["trainer", "rollout"])
    # The pod's network: the trainer's rendezvous and store on this machine (the pod IP is 127.0.0.1).
    network = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()),
               plan.ENV_SYNC_ADDR: f"127.0.0.1:{free_port()}"}
    volumes = tmp_path / "pod-volumes"
    procs, logs = [], []
    try:
        for name in containers:
            work = tmp_path / name
            work.mkdir()
            logs.append(work / "log")
            procs.append(pod_sandbox.start(pod, work, pod_name="t-trainer-0", config=kids["ConfigMap"]["data"],
                                           claims={"models": models}, overrides=network, secrets=SECRETS,
                                           log=work / "log", container=name, volumes_dir=volumes))
        done = wait_completed(trainer_port, SECRETS[n.token_name("t")][auth.TOKEN_KEY], procs, logs)
        assert done["step"] == 2 and done["placement"] == "colocated (turn-taking)"
        assert done["weightSyncBackend"] == "shm"
    finally:
        for p in procs:
            stop(p)
    records = [json.loads(line) for line in (volumes / "grpojob-run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_sync_backend"] for r in records] == ["shm", "shm"]
    for r in records:
        assert r["turns"]["sleep"]["decode_steps"] == r["turns"]["wake"]["decode_steps"]
    for log in logs:
        text = log.read_text()
        assert "Read-only file system" not in text and "Permission denied" not in text
    if gpus:  # both processes logged to the one container's log; the pod's SIGTERM reached both
        assert "colocated pod: trainer (pid" in text and "colocated pod: signal 15" in text
        assert "stopping (SIGTERM)" in text  # the engine's own word
