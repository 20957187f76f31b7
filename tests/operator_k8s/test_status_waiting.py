"""Why a job waits, as pure functions: a pod's problem read from its status and volumes (the
fields as the Kubernetes API gives them), said as a condition with the pod's reason, an Event
when it first shows, and the status message (issue 31)."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from grpojob.api import TrainerStatus
from grpojob.api.crd import crd
from grpojob_operator.status import Event, PodView, initial_status, transitions
from grpojob_operator.status.waiting import PodProblem, describe, pod_problem

from .test_status import T0, TRAINING, cond, job, pods, step

# The scheduler's words on v1.36.2 for a pod whose claim never binds (no default StorageClass;
# /work/shared/NOTES.md, "What a real cluster and a GPU did").
UNBOUND = ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes "
           "are available: 1 Preemption is not helpful for scheduling.")
CLAIM = "grpojob-checkpoints-j-trainer-0"


def trainer_spec(*extra_volumes: dict[str, Any]) -> dict[str, Any]:
    """Trainer pod 0's spec as its StatefulSet controller makes it: the template's volumes plus one
    per claim template, named after it (tests/helpers/statefulset.py)."""
    return {"containers": [{"name": "trainer", "image": "registry.test/grpojob:1"}],
            "volumes": [{"name": "grpojob-config", "configMap": {"name": "j-config"}}, *extra_volumes,
                        {"name": "grpojob-checkpoints", "persistentVolumeClaim": {"claimName": CLAIM}}]}


def unschedulable(message: str = UNBOUND) -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}


def waiting(name: str, reason: str, message: str = "", last: dict[str, Any] | None = None,
            image: str = "registry.test/grpojob:1", init: bool = False) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": name, "image": image, "ready": False, "restartCount": 3 if last else 0,
                          "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last:
        cs["lastState"] = {"terminated": last}
    return {"phase": "Pending" if init or not last else "Running",
            "initContainerStatuses" if init else "containerStatuses": [cs]}


def test_an_unbound_claim_is_named_from_the_pods_volumes_with_the_fields_that_bind_it():
    p = pod_problem(trainer_spec(), unschedulable())
    assert p == PodProblem("Unschedulable", UNBOUND, claims=(("grpojob-checkpoints", CLAIM),))
    text = describe(job(), "j-trainer-0", p)
    assert text.startswith("j-trainer-0 cannot be scheduled: 0/1 nodes are available: pod has unbound immediate "
                           "PersistentVolumeClaims")
    assert f"claims: {CLAIM} (the trainer's checkpoint claim" in text and "no storageClassName" in text
    for field in ("spec.checkpoint.storageClassName", "spec.checkpoint.volumeClaim", "spec.checkpoint.storage",
                  "default StorageClass"):
        assert field in text
    # A StorageClass named by the job, a model claim, a claim of the user's: each said for what it is.
    model = {"name": "grpojob-models", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}}
    mine = {"name": "data", "persistentVolumeClaim": {"claimName": "my-data"}}
    text = describe(job(checkpoint={"storageClassName": "fast"}), "j-trainer-0",
                    pod_problem(trainer_spec(model, mine), unschedulable()))
    assert "weights (spec.model.volumeClaim: it must exist and be bound)" in text
    assert "my-data (the pod's volume data)" in text and "storageClassName fast: that StorageClass must exist" in text
    # A scheduler message on anything else names no claim.
    cpu = describe(job(), "j-trainer-0", pod_problem(trainer_spec(), unschedulable("0/3 nodes are available: 3 "
                                                                                    "Insufficient cpu.")))
    assert cpu == "j-trainer-0 cannot be scheduled: 0/3 nodes are available: 3 Insufficient cpu"


@pytest.mark.parametrize("status, expected", [
    (waiting("trainer", "ErrImagePull", "rpc error: not found", image="registry.test/nope:1"),
     "j-trainer-0: container trainer cannot pull image registry.test/nope:1 (ErrImagePull: rpc error: not found)"),
    (waiting("trainer", "ImagePullBackOff", 'Back-off pulling image "registry.test/nope:1"', image=""),
     # no image in the container status yet: the pod spec's
     "j-trainer-0: container trainer cannot pull image registry.test/grpojob:1 (ImagePullBackOff: Back-off pulling "
     'image "registry.test/nope:1")'),
    (waiting("trainer", "CrashLoopBackOff", "back-off 40s restarting failed container",
             last={"exitCode": 1, "reason": "Error", "message": "PluginImportFailed: no module named mine"}),
     "j-trainer-0: container trainer keeps failing (CrashLoopBackOff), last run exit code 1 (Error): "
     "PluginImportFailed: no module named mine"),
    (waiting("trainer", "CreateContainerConfigError", "couldn't find key token in Secret ml/j-token"),
     "j-trainer-0: container trainer cannot be configured (CreateContainerConfigError): couldn't find key token in "
     "Secret ml/j-token"),
    (waiting("install-code", "CrashLoopBackOff", last={"exitCode": 1, "reason": "Error"}, init=True),
     "j-trainer-0: init container install-code keeps failing (CrashLoopBackOff), last run exit code 1 (Error)"),
    ({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
     "j-trainer-0 failed: Evicted: The node was low on resource: memory."),
])
def test_a_container_that_cannot_start_says_why_in_the_kubelets_words(status, expected):
    spec = {**trainer_spec(), "initContainers": [{"name": "install-code", "image": "registry.test/grpojob:1"}]}
    p = pod_problem(spec, status)
    assert p is not None and describe(job(), "j-trainer-0", p) == expected


def test_a_long_termination_message_keeps_its_end_and_a_pod_that_starts_has_no_problem():
    long = "Traceback (most recent call last):\n" + "x" * 2000 + "\nRuntimeError: the real reason"
    p = pod_problem({}, waiting("trainer", "CrashLoopBackOff", last={"exitCode": 1, "message": long}))
    assert p.message.endswith("RuntimeError: the real reason") and len(p.message) < 450
    for quiet in ({"phase": "Pending"}, waiting("trainer", "ContainerCreating"), waiting("trainer", "PodInitializing"),
                  {"phase": "Running", "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}):
        assert pod_problem(trainer_spec(), quiet) is None
    gated = pod_problem({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}, {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]})
    assert describe(job(), "p", gated) == ("p waits to be admitted: its scheduling gates (kueue.x-k8s.io/admission) "
                                           "are still on (a queue such as Kueue removes them)")


def stuck_trainer(status: dict[str, Any], uid: str = "trainer-0") -> PodView:
    return PodView("j-trainer-0", uid, "trainer", phase=status.get("phase", "Pending"),
                   problem=pod_problem(trainer_spec(), status))


def test_a_job_whose_claim_never_binds_says_so_in_a_condition_an_event_and_its_message():
    j = job(trainer={"replicas": 1})
    d = step(j, initial_status(T0))
    stuck = step(j, d.status, now=T0 + timedelta(seconds=10), tp=[stuck_trainer(unschedulable())],
                 rp=pods("rollout", 2, ready=False))
    st = stuck.status
    c = cond(st, "TrainerReady")
    assert (c.status, c.reason) == ("False", "Unschedulable") and c.message.startswith("0/1 trainer pods ready: ")
    assert CLAIM in c.message and "spec.checkpoint.storageClassName" in c.message
    assert st.phase == "Initializing" and st.message.startswith("waiting for pods: trainer 0/1, rollout 0/2 ready; ")
    assert CLAIM in st.message
    assert [e for e in transitions(d.status, st) if e.reason == "Unschedulable"] == \
        [Event("Warning", "Unschedulable", f"TrainerReady=False: {c.message}")]
    # The same problem a look later (other numbers): no second Event.
    again = step(j, st, now=T0 + timedelta(seconds=20), tp=[stuck_trainer(unschedulable(UNBOUND.replace("0/1", "0/2")))],
                 rp=pods("rollout", 2, ready=False))
    assert transitions(st, again.status) == []


def test_an_image_that_backs_off_is_one_event_and_a_crash_loop_while_running_is_in_the_message():
    j = job(trainer={"replicas": 1})
    d = step(j, initial_status(T0))
    pulls = [waiting("trainer", "ErrImagePull", "rpc error: not found"),
             waiting("trainer", "ImagePullBackOff", 'Back-off pulling image "registry.test/grpojob:1"'),
             waiting("trainer", "ErrImagePull", "rpc error: not found")]
    seen: list[Event] = []
    prev = d.status
    for i, s in enumerate(pulls):
        d = step(j, prev, now=T0 + timedelta(seconds=10 * i), tp=[stuck_trainer(s)], rp=pods("rollout", 2))
        seen += [e for e in transitions(prev, d.status) if e.type == "Warning"]
        prev = d.status
    assert [e.reason for e in seen] == ["ErrImagePull"] and "registry.test/grpojob:1" in seen[0].message
    assert cond(prev, "TrainerReady").reason == "ErrImagePull"
    # Running, with one of two rollout servers crash-looping: the job runs and says which one fails.
    crash = PodView("j-rollout-1", "rollout-1", "rollout", phase="Running", restarts=3, problem=pod_problem(
        {}, waiting("rollout", "CrashLoopBackOff", last={"exitCode": 1, "reason": "Error", "message": "EngineFailed: OOM"})))
    r = step(j, prev, tp=pods("trainer", 1), rp=[pods("rollout", 1)[0], crash], trainer=TRAINING)
    assert r.status.phase == "Running"
    assert r.status.message == ("step 3/20; j-rollout-1: container rollout keeps failing (CrashLoopBackOff), last run "
                                "exit code 1 (Error): EngineFailed: OOM")
    assert cond(r.status, "RolloutReady").reason == "CrashLoopBackOff"
    assert ("Warning", "CrashLoopBackOff") in [(e.type, e.reason) for e in transitions(prev, r.status)]


def test_running_comes_with_the_trainers_first_step_not_with_the_readiness_probes():
    """Pods Running, not yet Ready (a readiness probe runs every 10 s): the trainer's word that it
    stepped is enough (issue 31: Running came at policy version 12)."""
    j = job(trainer={"replicas": 1})
    d = step(j, initial_status(T0))
    unready = dict(tp=pods("trainer", 1, ready=False), rp=pods("rollout", 2, ready=False))
    starting = step(j, d.status, trainer=TrainerStatus(phase="starting"), **unready)
    assert starting.status.phase == "Initializing" and starting.status.message.startswith("the trainer says starting")
    waits = step(j, starting.status, trainer=TrainerStatus(phase="running", step=0, total_steps=20), **unready)
    assert waits.status.phase == "Initializing"
    assert waits.status.message == "the trainer waits for its first samples: trainer 0/1, rollout 0/2 ready"
    first = step(j, waits.status, trainer=TrainerStatus(phase="running", step=1, total_steps=20), **unready)
    assert first.status.phase == "Running" and first.status.message == "step 1/20"
    # a step that waits: the trainer's own words (which rollout server fails and why) in the message
    waiting = "step 2 waits for its groups: rollout servers failing: http://r0:8000: HTTP 503: engine dead"
    stalled = step(j, first.status, trainer=TrainerStatus(phase="running", step=1, total_steps=20, message=waiting),
                   **unready)
    assert stalled.status.message == f"step 1/20; {waiting}"


def jsonpath(doc: dict[str, Any], path: str) -> Any:
    """A printer column's simple JSONPath (.a.b.c) in a GRPOJob, as kubectl get evaluates it."""
    for key in path.strip(".").split("."):
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def test_kubectl_get_grpo_shows_the_unbound_claim():
    """`kubectl get grpo` (the CRD's default printer columns) names the claim that does not bind."""
    j = job(trainer={"replicas": 1})
    d = step(j, initial_status(T0))  # the children are made; the next look sees the pods
    st = step(j, d.status, now=T0 + timedelta(seconds=10), tp=[stuck_trainer(unschedulable())],
              rp=pods("rollout", 2)).status
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    shown = [str(jsonpath({"status": st.dump()}, c["jsonPath"])) for c in columns if c.get("priority", 0) == 0]
    assert any(CLAIM in value for value in shown), shown
