"""A job that cannot start says why, and its status follows the truth (issue 31), end to end: the
real operator against the emulator, with the scheduler and the kubelet acted out where a pod cannot
start (scheduler.py) and the trainer stand-in saying what a trainer says."""
from __future__ import annotations

import time
from typing import Any

from grpojob_operator import names as n
from grpojob_operator.config import OperatorConfig

from .cluster import eventually
from .conftest import NS, PER_POD, job_manifest, job_path
from .kmock_shim import EVENTS, GRPOJOBS, Emulator
from .scheduler import UNBOUND, container_waits, schedule_without_storage_class
from .test_operator import cond, status

SMALL = dict(trainer={"replicas": 1, "processesPerReplica": 1}, rollout={"replicas": 1}, checkpoint=PER_POD)


def warnings(emu: Emulator, job: str) -> list[dict[str, Any]]:
    return [e for e in emu.live(EVENTS, NS) if e.get("involvedObject", {}).get("name") == job
            and e.get("type") == "Warning"]


def status_patches(emu: Emulator, name: str) -> list[dict[str, Any]]:
    """Every status the operator wrote for the job, as merge patches, in order."""
    return [(r.data or {}).get("status") or {} for r in emu.requests_for(GRPOJOBS, "update")
            if r.subresource == "status" and r.name == name]


async def test_a_job_on_a_cluster_without_a_storage_class_names_its_unbound_claim(emulator, cluster, operator,
                                                                                 trainer):
    """Done when (issue 31): the unbound claim by name in the status (the TrainerReady condition and
    the message, the value `kubectl get grpo` would show in a Message column), and in an Event."""
    await cluster.create(job_path(), job_manifest("nosc", **SMALL))
    await eventually(lambda: len(cluster.pods(NS, "nosc")) == 2, what="pods")
    await cluster.run_pods(NS, "nosc", "rollout")
    assert await schedule_without_storage_class(cluster, NS, "nosc") == ["nosc-trainer-0"]
    refused = time.monotonic()
    claim = f"grpojob-checkpoints-{n.trainer_name('nosc')}-0"  # the StatefulSet controller's name for it

    await eventually(lambda: cond(emulator, "nosc", "TrainerReady").get("reason") == "Unschedulable",
                     timeout=30, what="TrainerReady=False Unschedulable")
    # A look every interval (10 s by default on a cluster) reads the pods it already watches.
    assert time.monotonic() - refused < 30 and OperatorConfig().interval <= 10
    c = cond(emulator, "nosc", "TrainerReady")
    assert c["status"] == "False" and claim in c["message"] and UNBOUND.rstrip(". ")[:60] in c["message"]
    assert "spec.checkpoint.storageClassName" in c["message"] and "spec.checkpoint.volumeClaim" in c["message"]
    st = status(emulator, "nosc")
    assert st["phase"] == "Initializing" and claim in st["message"]
    assert st["message"].startswith("waiting for pods: trainer 0/1, rollout 1/1 ready; nosc-trainer-0 cannot be "
                                    "scheduled: 0/1 nodes are available: pod has unbound immediate")
    await eventually(lambda: [e for e in warnings(emulator, "nosc") if e["reason"] == "Unschedulable"], what="event")
    (event,) = [e for e in warnings(emulator, "nosc") if e["reason"] == "Unschedulable"]
    assert claim in event["message"] and "spec.checkpoint.storageClassName" in event["message"]


async def test_an_image_that_does_not_pull_a_missing_secret_key_and_a_crash_loop_each_say_why(emulator, cluster,
                                                                                              operator, trainer):
    await cluster.create(job_path(), job_manifest("bad", **{**SMALL, "trainer": {**SMALL["trainer"], "image": "registry.test/nope:1"}}))
    await eventually(lambda: len(cluster.pods(NS, "bad")) == 2, what="pods")
    trainer_pod = f"{n.trainer_name('bad')}-0"
    (rollout_pod,) = [p["metadata"]["name"] for p in cluster.pods(NS, "bad", "rollout")]
    await container_waits(cluster, NS, trainer_pod, "trainer", "ErrImagePull", "rpc error: code = NotFound",
                          image="registry.test/nope:1")
    await container_waits(cluster, NS, rollout_pod, "rollout", "CreateContainerConfigError",
                          "couldn't find key token in Secret ml/bad-token")
    await eventually(lambda: cond(emulator, "bad", "TrainerReady").get("reason") == "ErrImagePull", what="image")
    assert "cannot pull image registry.test/nope:1" in cond(emulator, "bad", "TrainerReady")["message"]
    await eventually(lambda: cond(emulator, "bad", "RolloutReady").get("reason") == "CreateContainerConfigError",
                     what="config error")
    assert "couldn't find key token in Secret ml/bad-token" in cond(emulator, "bad", "RolloutReady")["message"]
    # The kubelet backs off: ImagePullBackOff, then ErrImagePull again. One problem, one Event.
    await container_waits(cluster, NS, trainer_pod, "trainer", "ImagePullBackOff",
                          'Back-off pulling image "registry.test/nope:1"', image="registry.test/nope:1")
    await eventually(lambda: cond(emulator, "bad", "TrainerReady").get("reason") == "ImagePullBackOff", what="back-off")
    # Now it pulls, and crash-loops with a termination message.
    await container_waits(cluster, NS, trainer_pod, "trainer", "CrashLoopBackOff", "back-off 20s",
                          last={"exitCode": 1, "reason": "Error", "message": "PluginImportFailed: no module named x"},
                          restarts=2)
    await eventually(lambda: cond(emulator, "bad", "TrainerReady").get("reason") == "CrashLoopBackOff", what="crash")
    assert "PluginImportFailed: no module named x" in status(emulator, "bad")["message"]
    await eventually(lambda: "CrashLoopBackOff" in [e["reason"] for e in warnings(emulator, "bad")], what="event")
    reasons = [e["reason"] for e in warnings(emulator, "bad")]
    assert reasons.count("ErrImagePull") + reasons.count("ImagePullBackOff") == 1, reasons
    assert "CreateContainerConfigError" in reasons and "CrashLoopBackOff" in reasons


async def test_running_comes_within_a_look_of_the_first_step(emulator, cluster, operator, trainer):
    """Issue 31: a real cluster showed Running first at policy version 12. The pods run but their
    readiness probes have not passed yet; the trainer's first step is enough."""
    await cluster.create(job_path(), job_manifest("quick", **SMALL))
    await eventually(lambda: len(cluster.pods(NS, "quick")) == 2, what="pods")
    for p in cluster.pods(NS, "quick"):
        await cluster.set_pod(NS, p["metadata"]["name"], ready=False)
    trainer.set(NS, "quick", phase="running", step=0, totalSteps=20)
    await eventually(lambda: status(emulator, "quick").get("message", "").startswith("the trainer waits for its first "
                                                                                     "samples"), what="waits")
    assert status(emulator, "quick")["phase"] == "Initializing"
    trainer.set(NS, "quick", step=1, policyVersion=1)
    await eventually(lambda: status(emulator, "quick").get("phase") == "Running", timeout=5, what="Running")
    first = next(p for p in status_patches(emulator, "quick") if p.get("phase") == "Running")
    assert first["progress"]["step"] == 1 and first["message"] == "step 1/20"


async def test_ready_counts_follow_the_pods_through_scale_down_even_when_the_watch_missed_a_delete(
        emulator, cluster, operator, trainer):
    """Issue 31: after Succeeded a real cluster showed `trainer: {desired: 0, ready: 1}`. kopf's index
    drops a pod on its DELETED event only; a watch that ends and re-lists (410 Gone) never sees the
    delete of a pod that went meanwhile (kopf re-lists what exists and forgets nothing,
    kopf/_core/reactor/queueing.py and _core/engines/indexing.py). Acted out: the pods leave the
    emulator's storage without a watch event. The operator checks the pods of a role scaled to zero
    with the API server, so the counts reach 0."""
    from .acted_trainer import ActedTrainer
    from .kmock_shim import PODS

    await cluster.create(job_path(), job_manifest("gone", **{**SMALL, "training": {"steps": 2}}))
    await eventually(lambda: len(cluster.pods(NS, "gone")) == 2, what="pods")
    await cluster.run_pods(NS, "gone")
    actor = ActedTrainer(emulator, trainer, NS, "gone", 2)
    await actor.start()
    cluster.make_pods = False  # the workload controllers stop here: the pods stay until the test removes them
    await actor.train(2)
    await eventually(lambda: status(emulator, "gone").get("phase") == "Succeeded", what="Succeeded")
    st = status(emulator, "gone")
    assert (st["trainer"]["desired"], st["rollout"]["desired"]) == (0, 0)
    for pod in cluster.pods(NS, "gone"):  # deleted, and no watch ever hears of it
        emulator.objects[(PODS, NS, pod["metadata"]["name"])].delete()
    await eventually(lambda: status(emulator, "gone")["trainer"] == {"desired": 0, "ready": 0}
                     and status(emulator, "gone")["rollout"] == {"desired": 0, "ready": 0}, what="ready 0")
    assert cond(emulator, "gone", "TrainerReady")["message"] == "no trainer pods wanted"
