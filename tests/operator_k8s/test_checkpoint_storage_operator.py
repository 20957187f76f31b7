"""Checkpoint storage on a cluster (issue #56): several trainer pods on an emptyDir each, whose
checkpoints no pod could resume from once one pod is lost, are InvalidSpec with the field path and
get no children (the spec fixed, the job gets them); the children of each storage choice: one
shared claim, an object store, a claim per pod (one trainer pod or two)."""
from __future__ import annotations

from grpojob import plan
from grpojob.api import parse
from grpojob_operator import children, pods
from tests.helpers.k8s_schema import validate_all

from .cluster import eventually
from .conftest import NS, ONE_POD, PER_POD, job_manifest, job_path
from .test_children import build, container, env_of
from .test_operator import cond, events, kids, status


async def test_several_trainer_pods_on_an_emptydir_each_are_InvalidSpec_and_get_no_pods(emulator, cluster,
                                                                                    operator, trainer):
    ephemeral = {**PER_POD, "storage": "ephemeral"}
    await cluster.create(job_path(), job_manifest("perpod", checkpoint=ephemeral))  # trainer.replicas 2
    await eventually(lambda: cond(emulator, "perpod", "InvalidSpec").get("status") == "True", what="InvalidSpec")
    c = cond(emulator, "perpod", "InvalidSpec")
    assert c["message"].startswith("spec.checkpoint.storage: ephemeral with trainer.replicas 2"), c
    assert status(emulator, "perpod")["phase"] == "Failed"
    await eventually(lambda: ("Warning", "InvalidSpec") in events(emulator, "perpod"), what="event")
    assert not kids(emulator, "perpod") and not cluster.pods(NS, "perpod")
    # a URL is no directory: refused where it is written, not a folder named "s3:" in the pods
    await cluster.create(job_path(), job_manifest("url", checkpoint={"path": "ftp://store/run1"}))
    await eventually(lambda: cond(emulator, "url", "InvalidSpec").get("status") == "True", what="URL refused")
    assert cond(emulator, "url", "InvalidSpec")["message"].startswith(
        "spec.checkpoint.path: 'ftp://' is not a store checkpoints are written to")
    assert not kids(emulator, "url")
    # a claim per pod: the same job gets its children
    await cluster.patch(job_path(NS, "perpod"), {"spec": {"checkpoint": {"storage": "persistent"}}})
    await eventually(lambda: cond(emulator, "perpod", "InvalidSpec").get("status") == "False", what="valid again")
    await eventually(lambda: len(cluster.pods(NS, "perpod")) == 4, what="pods (2 trainer, 2 rollout)")


STORE = {"volumeClaim": None, "path": "s3://ckpt/run1", "credentialsSecret": "ckpt-s3"}


def _trainer(kids: dict) -> dict:
    return kids[("StatefulSet", "j-trainer")]["spec"]


def test_the_children_of_each_checkpoint_storage_choice():
    """One shared claim (every pod mounts it), an object store (no volume; its credentials in the
    trainer's environment, the URL as the checkpoint directory), a claim per pod (one pod)."""
    shared = build(job_manifest("j"))
    (vol,) = [v for v in _trainer(shared)["template"]["spec"]["volumes"] if v["name"] == pods.CHECKPOINTS_VOLUME]
    assert vol["persistentVolumeClaim"] == {"claimName": "grpo-checkpoints"}
    assert "volumeClaimTemplates" not in _trainer(shared)

    store = build(job_manifest("j", checkpoint=STORE))
    sts = _trainer(store)
    c = container(store[("StatefulSet", "j-trainer")])
    assert "volumeClaimTemplates" not in sts
    assert pods.CHECKPOINTS_VOLUME not in {v["name"] for v in sts["template"]["spec"]["volumes"]}
    assert pods.CHECKPOINTS_VOLUME not in {m["name"] for m in c["volumeMounts"]}
    assert env_of(c)[plan.ENV_CHECKPOINT_DIR] == "s3://ckpt/run1"
    assert {"secretRef": {"name": "ckpt-s3"}} in c["envFrom"]
    assert not [k for k in store if k[0] == "PersistentVolumeClaim"]
    assert children.cluster_errors(parse(job_manifest("j", checkpoint=STORE))) == []  # 2 trainer pods: fine
    rollout = container(store[("Deployment", "j-rollout")])
    assert "envFrom" not in rollout  # only the trainer writes checkpoints
    validate_all([store[("StatefulSet", "j-trainer")]])

    for trainer in (ONE_POD, {"replicas": 2}):  # a claim per pod: one trainer pod, or two (checkpoint/pods.py)
        per_pod = build(job_manifest("j", trainer=trainer, checkpoint=PER_POD))
        sts = _trainer(per_pod)
        assert sts["replicas"] == trainer["replicas"]
        (template,) = sts["volumeClaimTemplates"]
        assert template["metadata"]["name"] == pods.CHECKPOINTS_VOLUME
        assert template["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
        assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
        # the controller adds each pod's claim as the volume: none in the template, mounted at the path
        assert pods.CHECKPOINTS_VOLUME not in {v["name"] for v in sts["template"]["spec"]["volumes"]}
        c = container(per_pod[("StatefulSet", "j-trainer")])
        assert {"name": pods.CHECKPOINTS_VOLUME, "mountPath": "/checkpoints"} in c["volumeMounts"]
        assert env_of(c)[plan.ENV_CHECKPOINT_DIR] == "/checkpoints"
        assert not [k for k in per_pod if k[0] == "PersistentVolumeClaim"]  # the template's claims are the controller's
        assert sorted(k for k in per_pod) == sorted(k for k in shared)  # the same children as a shared claim's
        validate_all([per_pod[("StatefulSet", "j-trainer")]])


async def test_two_trainer_pods_on_a_claim_each_get_their_pods_and_claims(emulator, cluster, operator, trainer):
    """The acted-out StatefulSet controller makes one claim per pod from the template; pod i mounts
    checkpoints-<statefulset>-i at the checkpoint path."""
    await cluster.create(job_path(), job_manifest("rwo", checkpoint=PER_POD))  # trainer.replicas 2
    await eventually(lambda: len(cluster.pods(NS, "rwo", "trainer")) == 2, what="2 trainer pods")
    assert cond(emulator, "rwo", "InvalidSpec").get("status") != "True"
    for pod in cluster.pods(NS, "rwo", "trainer"):
        i = pod["metadata"]["name"].rsplit("-", 1)[1]
        (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == pods.CHECKPOINTS_VOLUME]
        assert vol["persistentVolumeClaim"]["claimName"] == f"{pods.CHECKPOINTS_VOLUME}-rwo-trainer-{i}"


async def test_a_job_with_object_store_checkpoints_and_two_trainer_pods_gets_its_pods(emulator, cluster, operator,
                                                                                  trainer):
    await cluster.create(job_path(), job_manifest("obj", checkpoint=STORE))
    await eventually(lambda: len(cluster.pods(NS, "obj", "trainer")) == 2, what="2 trainer pods")
    assert cond(emulator, "obj", "InvalidSpec").get("status") != "True"
    for pod in cluster.pods(NS, "obj", "trainer"):
        c = pod["spec"]["containers"][0]
        assert {"secretRef": {"name": "ckpt-s3"}} in c["envFrom"]
        assert {e["name"]: e.get("value") for e in c["env"]}[plan.ENV_CHECKPOINT_DIR] == "s3://ckpt/run1"


def test_suspend_is_refused_for_an_emptydir_only_not_for_checkpoints_in_an_object_store():
    """checkpoint.storage ephemeral keeps checkpoints in an emptyDir, lost with the pods a suspend
    scales away: refused; the same job with its checkpoints in a store suspends (the store keeps
    them; the sandbox test resumes from it)."""
    from datetime import datetime, timezone

    from grpojob.api.status import TrainerStatus
    from grpojob_operator.status import Observation, PodView, decide, initial_status

    now = datetime(2026, 12, 2, tzinfo=timezone.utc)
    for where, refused in (({**PER_POD, "storage": "ephemeral"}, True), ({**STORE, "storage": "ephemeral"}, False)):
        job = parse(job_manifest("j", trainer=ONE_POD, checkpoint=where, runPolicy={"suspend": True}))
        pod = PodView(name="j-trainer-0", uid="u0", role="trainer", phase="Running", ready=True)
        obs = Observation(now=now, trainer_pods=[pod], trainer=TrainerStatus(phase="running", step=3))
        suspended = next(c for c in decide(job, initial_status(now), obs).status.conditions if c.type == "Suspended")
        assert (suspended.reason == "SuspendRefused") is refused, (where, suspended)
