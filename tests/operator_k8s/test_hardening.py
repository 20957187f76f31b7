"""What a real control plane showed (issue 13), end to end: the real operator against kmock, with the
server rules kmock lacks acted out (tests/operator_k8s/admission.py) and the workload controllers
acted out (cluster.py, which rolls pods when a pod template changes)."""
from __future__ import annotations

import asyncio

import kmock

from grpojob_operator import names as n
from grpojob_operator import rbac

from .admission import ENFORCE_LABEL
from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .kmock_shim import STATEFULSETS
from .test_operator import cond, events, kids, replicas, running, status


async def test_children_are_refused_without_the_finalizers_verb_and_the_error_is_an_event(
        emulator, cluster, operator, trainer, monkeypatch):
    """Acts out OwnerReferencesPermissionEnforcement with the rules of an operator that lacks
    `update grpojobs/finalizers`: every child is refused, and the job says so where a user looks."""
    lacking = tuple(r for r in rbac.RBAC_RULES if r.resource != "grpojobs/finalizers")
    monkeypatch.setattr(rbac, "RBAC_RULES", lacking)
    await cluster.create(job_path(), job_manifest("fin"))
    await eventually(lambda: cond(emulator, "fin", "Created").get("reason") == "ChildError", what="ChildError")
    message = cond(emulator, "fin", "Created")["message"]
    assert "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on" \
        in message
    assert not kids(emulator, "fin")
    await eventually(lambda: ("Warning", "ChildError") in events(emulator, "fin"), what="ChildError event")


async def test_the_operators_own_rules_pass_owner_reference_enforcement(emulator, cluster, operator, trainer):
    assert rbac.allows("grpojob.io", "grpojobs/finalizers", "update")
    await cluster.create(job_path(), job_manifest("own"))
    await eventually(lambda: len(kids(emulator, "own")) == 7, what="children")
    assert all(o["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] for o in kids(emulator, "own").values())


async def test_a_missing_monitoring_crd_warns_and_the_job_carries_on(emulator, cluster, operator, trainer):
    """Acts out a cluster without the Prometheus Operator CRDs: the API server answers 404 for the
    resource type itself."""
    async def no_podmonitors(request) -> None:
        if request.resource is not None and request.resource.group == "monitoring.coreos.com":
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource",
                                        details={})
    emulator.hooks.append(no_podmonitors)
    await running(emulator, cluster, trainer, "mon", monitoring={"podMonitor": True})
    created = cond(emulator, "mon", "Created")
    assert (created["status"], created["reason"]) == ("True", "OptionalChildSkipped")
    assert "PodMonitor left out: this cluster does not serve monitoring.coreos.com/v1 (install its CRDs, or set " \
        "spec.monitoring.podMonitor: false)" in created["message"]
    assert len(kids(emulator, "mon")) == 7
    await eventually(lambda: ("Warning", "OptionalChildSkipped") in events(emulator, "mon"), what="warning event")
    # It is not retried on every look.
    tries = [r for r in list(emulator._requests) if r.resource is not None
             and r.resource.group == "monitoring.coreos.com"]
    await asyncio.sleep(1.0)  # five operator intervals
    assert len([r for r in list(emulator._requests) if r.resource is not None
                and r.resource.group == "monitoring.coreos.com"]) == len(tries)


async def test_a_kueue_gang_holds_the_whole_job_and_keeps_its_size_while_it_runs(emulator, cluster, operator, trainer):
    """Every trainer and rollout pod carries the one pod group, with the whole job's count (Kueue's
    plain Pod groups: https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/). A new rollout count
    would be a new gang, restarting every pod: refused while the job runs, nothing restarts."""
    await running(emulator, cluster, trainer, "gang", scheduling={"gang": "kueue", "queueName": "gpu"},
                  rollout={"replicas": 4})
    for pod in cluster.pods(NS, "gang"):
        meta = pod["metadata"]
        assert meta["labels"]["kueue.x-k8s.io/pod-group-name"] == "gang", meta["name"]
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "6"  # 2 trainer + 4 rollout pods
    uids = {p["metadata"]["uid"] for p in cluster.pods(NS, "gang")}
    await cluster.patch(job_path(NS, "gang"), {"spec": {"rollout": {"replicas": 2}}})
    await eventually(lambda: cond(emulator, "gang", "InvalidSpec").get("reason") == "ImmutableFieldChanged",
                     what="refused")
    assert "scheduling.gang kueue" in cond(emulator, "gang", "InvalidSpec")["message"]
    await asyncio.sleep(0.5)  # the acted-out controllers would have rolled or scaled by now
    assert replicas(emulator, "gang") == (2, 4) and {p["metadata"]["uid"] for p in cluster.pods(NS, "gang")} == uids
    assert status(emulator, "gang")["phase"] == "Running"


async def test_an_unreachable_trainer_is_a_condition_an_event_and_the_status_message(emulator, cluster, operator,
                                                                                   trainer):
    await running(emulator, cluster, trainer, "blind")
    trainer.unreachable.add((NS, "blind"))
    await eventually(lambda: cond(emulator, "blind", "TrainerReachable").get("status") == "False", what="unreachable")
    c = cond(emulator, "blind", "TrainerReachable")
    assert c["reason"] == "Unreachable" and "HTTP 503" in c["message"] and c["lastTransitionTime"]
    st = status(emulator, "blind")
    # Not Running while the trainer does not answer (issue 31): the phase and message say so.
    assert st["progress"]["totalSteps"] == 20 and st["phase"] == "Initializing"
    assert st["message"].startswith("the trainer does not answer: ") and "HTTP 503" in st["message"]
    assert cond(emulator, "blind", "Running")["reason"] == "TrainerUnreachable"
    assert all(x.get("lastTransitionTime") for x in st["conditions"])
    await eventually(lambda: ("Warning", "Unreachable") in events(emulator, "blind"), what="event")


async def test_suspend_never_scales_a_running_unreachable_trainer_down_without_asking(
        emulator, cluster, kubeconfig, operator_config, trainer):
    from .harness import OperatorThread

    op = await OperatorThread(operator_config(suspend_timeout=5.0)).start()
    try:
        await running(emulator, cluster, trainer, "deaf")
        trainer.unreachable.add((NS, "deaf"))
        await cluster.patch(job_path(NS, "deaf"), {"spec": {"runPolicy": {"suspend": True}}})
        # One snapshot once it was asked twice: still at full scale, still waiting, saying why.
        scale, asking = await eventually(lambda: trainer.suspends.count((NS, "deaf")) >= 2 and (
            replicas(emulator, "deaf"), cond(emulator, "deaf", "Suspended")), what="asked twice")
        assert scale == (2, 2), "scaled down before the timeout"
        assert asking["reason"] == "Checkpointing" and "HTTP 503" in asking["message"]
        await eventually(lambda: status(emulator, "deaf").get("phase") == "Suspended", what="suspended after timeout")
        c = cond(emulator, "deaf", "Suspended")
        assert c["reason"] == "CheckpointTimeout" and "no checkpoint confirmed within 5s" in c["message"]
        await eventually(lambda: replicas(emulator, "deaf") == (0, 0), what="scaled down")
        await eventually(lambda: ("Warning", "CheckpointTimeout") in events(emulator, "deaf"), what="event")
    finally:
        await op.stop()


async def test_a_clean_exit_at_step_zero_is_not_success(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "early")
    pod0 = n.trainer_name("early") + "-0"
    await cluster.set_pod(NS, pod0, restarts=1, last_exit={"exitCode": 0, "reason": "Completed"})
    await asyncio.sleep(1.0)
    assert status(emulator, "early")["phase"] == "Running" and status(emulator, "early")["restarts"] == 0
    # The trainer's own report at the last step, then its exit: success.
    trainer.set(NS, "early", step=20, totalSteps=20)
    await eventually(lambda: status(emulator, "early")["progress"]["step"] == 20, what="step 20 seen")
    trainer.states.pop((NS, "early"))
    await cluster.set_pod(NS, pod0, restarts=2, last_exit={"exitCode": 0, "reason": "Completed"})
    await eventually(lambda: status(emulator, "early").get("phase") == "Succeeded", what="Succeeded")


async def test_a_mixed_edit_applies_whole_or_not_at_all(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "mixed")
    await cluster.patch(job_path(NS, "mixed"), {"spec": {"trainer": {"replicas": 1}, "rollout": {"replicas": 3}}})
    await eventually(lambda: cond(emulator, "mixed", "InvalidSpec").get("reason") == "ImmutableFieldChanged",
                     what="refused")
    assert "not applied either" in cond(emulator, "mixed", "InvalidSpec")["message"]
    await asyncio.sleep(0.5)
    assert replicas(emulator, "mixed") == (2, 2) and status(emulator, "mixed")["rollout"]["desired"] == 2
    # The rollout change alone is taken.
    await cluster.patch(job_path(NS, "mixed"), {"spec": {"trainer": {"replicas": 2}}})
    await eventually(lambda: replicas(emulator, "mixed") == (2, 3), what="rollouts scaled")


async def test_a_restricted_namespace_gets_running_pods(emulator, cluster, operator, trainer):
    """Acts out PodSecurity admission enforcing `restricted` in the job's namespace."""
    await cluster.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": NS, "labels": {ENFORCE_LABEL: "restricted"}}})
    await running(emulator, cluster, trainer, "safe")  # every pod admitted, Running and Ready
    assert len(cluster.pods(NS, "safe")) == 4
    # The same namespace refuses a pod that asks for more (a user's override here).
    await cluster.create(job_path(), job_manifest("loud", trainer={"securityContext": {"privileged": True}}))
    await eventually(lambda: emulator.get_obj(STATEFULSETS, NS, n.trainer_name("loud")), what="StatefulSet")
    await asyncio.sleep(0.5)
    assert not cluster.pods(NS, "loud", "trainer") and len(cluster.pods(NS, "loud", "rollout")) == 2


async def test_a_bad_kubernetes_object_in_the_spec_is_InvalidSpec_with_its_path(emulator, cluster, operator, trainer):
    """kmock does not apply the CRD's schema; the operator checks the same official schemas."""
    await cluster.create(job_path(), job_manifest("tol", trainer={"tolerations": [{"key": {"name": "gpu"}}]}))
    await eventually(lambda: cond(emulator, "tol", "InvalidSpec").get("status") == "True", what="InvalidSpec")
    assert cond(emulator, "tol", "InvalidSpec")["message"] == "spec.trainer.tolerations[0].key: must be a string"
    assert not kids(emulator, "tol")


async def test_an_object_the_job_does_not_own_is_reported_not_taken_over(emulator, cluster, operator, trainer):
    """`grpojob render | kubectl apply`, then the job: its ConfigMap exists without an owner. Taking
    it over would change its owner references, which OwnerReferencesPermissionEnforcement (acted
    out) allows only with `delete` on configmaps, a verb the operator does not have."""
    from grpojob.api import parse
    from grpojob_operator import children

    (config,) = [o for o in children.build(parse(job_manifest("pre")), namespace=NS) if o["kind"] == "ConfigMap"]
    await cluster.create(f"/api/v1/namespaces/{NS}/configmaps", config)
    await cluster.create(job_path(), job_manifest("pre"))
    await eventually(lambda: cond(emulator, "pre", "Created").get("reason") == "ChildError", what="ChildError")
    assert "ConfigMap ml/pre-config exists and is not this GRPOJob's (controller: none)" in \
        cond(emulator, "pre", "Created")["message"]
    assert "ownerReferences" not in emulator.get_obj(kmock.resource("", "v1", "configmaps"), NS, "pre-config")["metadata"]
    await eventually(lambda: len(kids(emulator, "pre")) == 7, what="the other children")
    await eventually(lambda: ("Warning", "ChildError") in events(emulator, "pre"), what="event")
    # Deleted by its user: the operator creates its own.
    await cluster.delete(f"/api/v1/namespaces/{NS}/configmaps/pre-config")
    await eventually(lambda: cond(emulator, "pre", "Created").get("status") == "True", what="Created")
