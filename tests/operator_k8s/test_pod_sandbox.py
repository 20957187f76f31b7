"""The rendered trainer and rollout pods run: a real training job whose processes see exactly the
filesystem, user and privileges their pod would give them (read-only root, uid 10001, no
capabilities, no privilege escalation, writable only where the pod mounts a volume). The
container runtime is acted out by tests/helpers/pod_sandbox.py (mount namespaces; no cluster here)."""
from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from grpojob import auth, plan
from grpojob.api import parse
from grpojob.local.processes import free_port
from grpojob_operator import children
from grpojob_operator import names as n
from tests.helpers import pod_sandbox, statefulset
from tests.helpers.trainer_status import wait_completed

from .conftest import PER_POD, job_manifest

ok, why = pod_sandbox.available()
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")]


@pytest.fixture
def cluster_job(tiny_dir, tmp_path):
    """A two-step job on the tiny model, its model on a 'PVC' (a directory the runtime user can read)."""
    models = tmp_path / "models"
    shutil.copytree(tiny_dir, models / "tiny")
    for p in [models, *models.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    trainer_port, rollout_port = free_port(), free_port()
    m = job_manifest("t", model={"path": "/models/tiny", "volumeClaim": "models"},
                     training={"steps": 2, "promptsPerStep": 4, "microBatchTokens": 512},
                     trainer={"replicas": 1, "processesPerReplica": 1, "port": trainer_port},
                     rollout={"replicas": 1, "backend": "hf", "port": rollout_port, "sampling": {"maxTokens": 8}},
                     checkpoint={**PER_POD, "everySteps": 1})
    kids = {o["kind"]: o for o in children.build(parse(m), namespace="ml")}
    network = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()),
               plan.ENV_SYNC_ADDR: f"127.0.0.1:{free_port()}"}
    # trainer pod 0's checkpoint claim (from the StatefulSet's claim template): an empty volume as
    # the kubelet hands it over under the pod's fsGroup: owned by that group, setgid, group-writable
    # (https://kubernetes.io/docs/tasks/configure-pod-container/security-context/#set-the-security-context-for-a-pod)
    ckpt = tmp_path / "claims" / "checkpoints"
    ckpt.mkdir(parents=True)
    os.chown(ckpt, 0, n.RUNTIME_UID)
    ckpt.chmod(0o2775)
    (claim,) = statefulset.claims(kids["StatefulSet"], 0)
    return kids, {"models": models, claim["metadata"]["name"]: ckpt}, network


SECRETS = {n.token_name("t"): {auth.TOKEN_KEY: auth.generate()}}  # what the operator puts in the job's Secret


def run(kids, claims, network, tmp_path, role, *, drop_mount: str = ""):
    pod = statefulset.pod_spec(kids["StatefulSet"], 0) if role == "trainer" else \
        copy.deepcopy(kids["Deployment"]["spec"]["template"]["spec"])
    if drop_mount:
        c = pod["containers"][0]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != drop_mount]
    work = tmp_path / role
    work.mkdir()
    proc = pod_sandbox.start(pod, work, pod_name=f"t-{role}-0", config=kids["ConfigMap"]["data"], claims=claims,
                             overrides=network, secrets=SECRETS, log=work / "log")
    return proc, work


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_trainer_and_rollout_pods_train_under_the_restricted_pod_security(cluster_job, tmp_path):
    kids, claims, network = cluster_job
    rollout, rwork = run(kids, claims, network, tmp_path, "rollout")
    trainer, twork = run(kids, claims, network, tmp_path, "trainer")
    port = json.loads(kids["ConfigMap"]["data"][plan.CONFIG_FILE])["spec"]["trainer"]["port"]
    try:
        done = wait_completed(port, SECRETS[n.token_name("t")][auth.TOKEN_KEY], [trainer, rollout],
                              [twork / "log", rwork / "log"])
        assert done["step"] == 2 and done["weightsInSync"] is True
        asked = time.monotonic()
        trainer.send_signal(signal.SIGTERM)  # the kubelet's, to PID 1 alone, when the operator scales the job down
        # exit 0: no `0/1 Error` in `kubectl get pods` once the job has Succeeded (issue 42)
        assert trainer.wait(20) == 0, (twork / "log").read_text()[-3000:]
        assert time.monotonic() - asked < 20, "a completed trainer stops at once"
        tlog, rlog = (twork / "log").read_text(), (rwork / "log").read_text()
    finally:
        stop(trainer)
        stop(rollout)
    for text in (tlog, rlog):
        assert "Read-only file system" not in text and "Permission denied" not in text
    # It wrote where its pod lets it: checkpoints on its claim, metrics on their volume, owned by the runtime user.
    ckpt = claims[statefulset.claims(kids["StatefulSet"], 0)[0]["metadata"]["name"]]
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-")) >= ["step-000001", "step-000002"]
    metrics = twork / "volumes" / "grpojob-run" / "metrics.jsonl"
    assert len(metrics.read_text().splitlines()) == 2
    assert metrics.stat().st_uid == n.RUNTIME_UID


PROBE = """
import os
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print("uid", os.getuid(), "groups", sorted(os.getgroups()))
print("caps", status["CapEff"].strip(), "nnp", status["NoNewPrivs"].strip())
for path in ("/etc/probe", "/opt/probe", os.environ["HOME"] + "/probe", "/tmp/probe", os.environ["GRPOJOB_RUN_DIR"] + "/probe",
             "/etc/grpojob/probe", "/models/probe", os.path.dirname(os.environ["GRPOJOB_TOKEN_FILE"]) + "/probe"):
    try:
        open(path, "w").close()
        print("writable", path)
    except OSError as e:
        print("refused", path, e.strerror)
print("token", len(open(os.environ["GRPOJOB_TOKEN_FILE"]).read()))
"""


def test_the_acted_out_pod_enforces_its_security_context(cluster_job, tmp_path):
    """The sandbox is no stand-in: the root, the config and the model are read-only, only the
    pod's emptyDirs take writes, and the process has no capability and cannot gain privileges."""
    kids, claims, network = cluster_job
    pod = copy.deepcopy(kids["Deployment"]["spec"]["template"]["spec"])
    pod["containers"][0]["command"] = ["python", "-c", PROBE]
    work = tmp_path / "probe"
    work.mkdir()
    proc = pod_sandbox.start(pod, work, pod_name="t-rollout-0", config=kids["ConfigMap"]["data"], claims=claims,
                             overrides=network, secrets=SECRETS, log=work / "log")
    assert proc.wait(60) == 0, (work / "log").read_text()
    out = (work / "log").read_text().splitlines()
    assert out[0] == f"uid {n.RUNTIME_UID} groups [{n.RUNTIME_UID}]"
    assert out[1] == "caps 0000000000000000 nnp 1"
    assert out[2:] == ["refused /etc/probe Read-only file system", "refused /opt/probe Read-only file system",
                       f"writable {n.HOME_DIR}/probe", "writable /tmp/probe", f"writable {n.RUN_DIR}/probe",
                       "refused /etc/grpojob/probe Read-only file system",
                       "refused /models/probe Read-only file system",
                       f"refused {n.TOKEN_DIR}/probe Read-only file system",
                       f"token {len(SECRETS['t-token']['token'])}"]  # the token: readable, by group
