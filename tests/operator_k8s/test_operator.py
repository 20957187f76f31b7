"""The real kopf operator end to end against the kmock API emulator.

No cluster runs here: the tests act out the StatefulSet/Deployment controllers, the kubelet and the
garbage collector (cluster.py), and a stand-in answers for the trainer leader pod (harness.TrainerStub).
Everything the operator does goes through the official Kubernetes client over HTTP.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import kmock

from grpojob.api import parse
from grpojob_operator import children
from grpojob_operator import names as n
from grpojob_operator.rbac import allows
from tests.helpers.k8s_schema import validate_all

from .cluster import Cluster, eventually
from .conftest import NS, job_manifest, job_path
from .harness import OperatorThread, TrainerStub
from .kmock_shim import (CONFIGMAPS, DEPLOYMENTS, EVENTS, GRPOJOBS, NETWORKPOLICIES, SERVICES, STATEFULSETS, Emulator,
                         fail_next)

CHILD_RESOURCES = (NETWORKPOLICIES, CONFIGMAPS, SERVICES, STATEFULSETS, DEPLOYMENTS)  # the Secret: test_security
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation")


def status(emu: Emulator, name: str) -> dict[str, Any]:
    return (emu.get_obj(GRPOJOBS, NS, name) or {}).get("status") or {}


def cond(emu: Emulator, name: str, type_: str) -> dict[str, Any]:
    return next((c for c in status(emu, name).get("conditions", []) if c["type"] == type_), {})


VERBS = {"list": "list", "watch": "watch", "fetch": "get", "create": "create", "update": "patch", "delete": "delete"}


def calls_made(emu: Emulator) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], RBAC verb) of every request the operator sent (the
    emulator's own kmock requests left out)."""
    used = set()
    for r in list(emu._requests):
        if r.resource is None or r.resource.plural is None or r.action is None \
                or r.headers.get("User-Agent", "").startswith("kmock/"):
            continue
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        used.add((r.resource.group, resource, VERBS[r.action.value.lower()]))
    return used


def kids(emu: Emulator, job: str, ns: str = NS) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"] if "kind" in o else res.plural, o["metadata"]["name"]): o
            for res in CHILD_RESOURCES for o in emu.live(res, ns)
            if o["metadata"].get("labels", {}).get(n.LABEL_JOB) == job}


def events(emu: Emulator, job: str) -> list[tuple[str, str]]:
    return [(e.get("type"), e.get("reason")) for e in emu.live(EVENTS, NS)
            if e.get("involvedObject", {}).get("name") == job]


def replicas(emu: Emulator, job: str) -> tuple[int, int]:
    return (emu.get_obj(STATEFULSETS, NS, n.trainer_name(job))["spec"]["replicas"],
            emu.get_obj(DEPLOYMENTS, NS, n.rollout_name(job))["spec"]["replicas"])


def without_server_fields(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_FIELDS}
    return {**obj, "metadata": meta}


async def running(emu: Emulator, cluster: Cluster, trainer: TrainerStub, name: str, **spec: Any) -> None:
    """Create a job and bring it to Running: pods made, then Running and Ready."""
    await cluster.create(job_path(), job_manifest(name, **spec))
    trainer.set(NS, name, phase="running", totalSteps=20)
    want = lambda: len(cluster.pods(NS, name)) == sum(replicas(emu, name))  # noqa: E731
    await eventually(lambda: emu.get_obj(DEPLOYMENTS, NS, n.rollout_name(name)) and want(), what="pods")
    await cluster.run_pods(NS, name)
    await eventually(lambda: status(emu, name).get("phase") == "Running", what=f"{name} Running")


async def test_create_gives_exact_children_with_owner_references(emulator, cluster, operator, trainer):
    await cluster.create(job_path(), job_manifest("exact"))
    await eventually(lambda: cond(emulator, "exact", "Created").get("status") == "True", what="Created")
    job_obj = emulator.get_obj(GRPOJOBS, NS, "exact")
    uid = job_obj["metadata"]["uid"]
    assert job_obj["metadata"]["finalizers"] == ["grpojob.io/finalizer"]  # kopf's, for its timer

    job = parse(job_manifest("exact"))
    expected = children.build(job, namespace=NS, image=operator.cfg.image,
                              owner=children.owner_reference("exact", uid))
    have = kids(emulator, "exact")
    assert sorted(have) == sorted(children.key(o) for o in expected)
    for obj in expected:
        got = have[children.key(obj)]
        assert got["metadata"]["ownerReferences"] == [children.owner_reference("exact", uid)]
        assert without_server_fields(got) == obj, f"{children.key(obj)} differs from the rendering"
    assert validate_all(have.values()) == 7

    st = status(emulator, "exact")
    assert st["phase"] == "Initializing"
    assert st["trainer"] == {"desired": 2, "ready": 0} and st["rollout"] == {"desired": 2, "ready": 0}
    assert {c["type"] for c in st["conditions"]} >= {"Created", "TrainerReady", "RolloutReady", "WeightsInSync",
                                                     "Running", "Suspended", "Succeeded", "Failed", "InvalidSpec"}
    await eventually(lambda: ("Normal", "ChildrenCreated") in events(emulator, "exact"), what="Created event")


async def test_ready_pods_give_running_with_trainer_progress(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "prog")
    lags = [{"replica": "prog-rollout-a", "version": 7, "lag": 0}, {"replica": "prog-rollout-b", "version": 6, "lag": 1}]
    trainer.set(NS, "prog", step=7, totalSteps=20, policyVersion=7, rewardMean=0.625, kl=0.01,
                tokensPerSecond=1234.5, lastCheckpointStep=5, weightsInSync=True, rollouts=lags,
                weightSyncBackend="gloo")
    await eventually(lambda: status(emulator, "prog").get("progress", {}).get("step") == 7, what="progress")
    st = status(emulator, "prog")
    assert st["progress"] == {"step": 7, "totalSteps": 20, "policyVersion": 7, "rewardMean": 0.625, "kl": 0.01,
                              "tokensPerSecond": 1234.5, "lastCheckpointStep": 5, "weightsInSync": True,
                              "rollouts": lags, "weightSyncBackend": "gloo"}
    assert st["trainer"] == {"desired": 2, "ready": 2} and st["rollout"] == {"desired": 2, "ready": 2}
    assert st["startTime"] and st["restarts"] == 0
    for t in ("TrainerReady", "RolloutReady", "Running"):
        assert cond(emulator, "prog", t)["status"] == "True", t
    await eventually(lambda: cond(emulator, "prog", "WeightsInSync").get("status") == "True", what="in sync")

    # One scrape of the operator shows the job.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{operator.controller.metrics.port}/metrics") as resp:
            text = await resp.text()
    assert 'grpojob_job_step{job="prog",namespace="ml"} 7.0' in text
    assert 'grpojob_job_reward_mean{job="prog",namespace="ml"} 0.625' in text
    assert 'grpojob_job_policy_lag{job="prog",namespace="ml"} 1.0' in text  # the slowest server's lag
    assert 'grpojob_operator_jobs{phase="Running"} 1.0' in text
    assert 'grpojob_operator_reconciles_total{result="success"}' in text
    assert "grpojob_operator_reconcile_seconds_count" in text
    await eventually(lambda: ("Normal", "AllReady") in events(emulator, "prog"), what="event")

    # Deleted by its user: kopf releases its finalizer, and the job's series leave the scrape.
    await cluster.delete(job_path(NS, "prog"))
    await eventually(lambda: emulator.get_obj(GRPOJOBS, NS, "prog") is None, what="job gone")
    await eventually(lambda: 'job="prog"' not in operator.controller.metrics.exposition().decode(),
                     what="job metrics forgotten")
    assert 'grpojob_operator_jobs{phase="Running"} 0.0' in operator.controller.metrics.exposition().decode()


async def test_suspend_checkpoints_scales_to_zero_and_resume_restarts(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "sus")
    trainer.set(NS, "sus", step=9, lastCheckpointStep=5)
    await cluster.patch(job_path(NS, "sus"), {"spec": {"runPolicy": {"suspend": True}}})

    await eventually(lambda: ("ml", "sus") in trainer.suspends, what="POST /suspend")
    await eventually(lambda: cond(emulator, "sus", "Suspended").get("reason") == "Checkpointing", what="checkpointing")
    assert replicas(emulator, "sus") == (2, 2), "scaled down before the checkpoint"
    # The trainer exits 0 after its checkpoint and the kubelet restarts it: not a failure.
    pod0 = n.trainer_name("sus") + "-0"
    await cluster.set_pod(NS, pod0, restarts=1, last_exit={"exitCode": 0, "reason": "Completed"})
    trainer.set(NS, "sus", phase="suspended", lastCheckpointStep=9)

    await eventually(lambda: status(emulator, "sus").get("phase") == "Suspended", what="Suspended")
    assert replicas(emulator, "sus") == (0, 0)
    assert cond(emulator, "sus", "Suspended")["status"] == "True"
    assert status(emulator, "sus")["progress"]["lastCheckpointStep"] == 9
    await eventually(lambda: not cluster.pods(NS, "sus"), what="pods gone")
    assert status(emulator, "sus")["restarts"] == 0

    trainer.set(NS, "sus", phase="running", step=9)
    await cluster.patch(job_path(NS, "sus"), {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(lambda: replicas(emulator, "sus") == (2, 2), what="scaled back")
    await eventually(lambda: len(cluster.pods(NS, "sus")) == 4, what="pods again")
    await cluster.run_pods(NS, "sus")
    await eventually(lambda: status(emulator, "sus").get("phase") == "Running", what="Running again")
    assert cond(emulator, "sus", "Suspended")["reason"] == "Resumed"
    assert status(emulator, "sus")["restarts"] == 0
    await eventually(lambda: {("Normal", "Checkpointed"), ("Normal", "Resumed")} <= set(events(emulator, "sus")),
                     what="events")


async def test_trainer_failures_up_to_and_past_backoff_limit(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "flaky", runPolicy={"backoffLimit": 2})
    pod0 = n.trainer_name("flaky") + "-0"
    crash = {"exitCode": 1, "reason": "Error", "message": "CUDA error: device-side assert"}
    for count in (1, 2):
        await cluster.set_pod(NS, pod0, restarts=count, last_exit=crash)
        await eventually(lambda: status(emulator, "flaky").get("restarts") == count, what=f"restarts={count}")
        assert status(emulator, "flaky")["phase"] != "Failed"
    await cluster.set_pod(NS, pod0, restarts=3, last_exit=crash)

    await eventually(lambda: status(emulator, "flaky").get("phase") == "Failed", what="Failed")
    failed = cond(emulator, "flaky", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "3 times (backoffLimit 2)" in failed["message"] and "device-side assert" in failed["message"]
    assert status(emulator, "flaky")["completionTime"]
    await eventually(lambda: replicas(emulator, "flaky") == (0, 0), what="cleanup (cleanPodPolicy All)")
    await eventually(lambda: ("Warning", "BackoffLimitExceeded") in events(emulator, "flaky"), what="event")


async def test_dead_rollout_pod_is_replaced_without_touching_the_trainer(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "roll")
    trainer_uids = {p["metadata"]["uid"] for p in cluster.pods(NS, "roll", "trainer")}
    sts_patches = len(emulator.requests_for(STATEFULSETS, "update"))
    victim = cluster.pods(NS, "roll", "rollout")[0]["metadata"]["name"]

    await cluster.delete_pod(NS, victim)
    await eventually(lambda: cond(emulator, "roll", "RolloutReady").get("status") == "False", what="RolloutReady=False")
    assert status(emulator, "roll")["phase"] == "Running"  # one rollout server still serves
    new = await eventually(lambda: [p["metadata"]["name"] for p in cluster.pods(NS, "roll", "rollout")
                                    if p["metadata"]["name"] != victim and p["status"]["phase"] == "Pending"],
                           what="replacement pod")
    await cluster.set_pod(NS, new[0])
    await eventually(lambda: cond(emulator, "roll", "RolloutReady").get("status") == "True", what="RolloutReady")

    assert {p["metadata"]["uid"] for p in cluster.pods(NS, "roll", "trainer")} == trainer_uids
    assert len(emulator.requests_for(STATEFULSETS, "update")) == sts_patches, "trainer StatefulSet was touched"
    assert status(emulator, "roll")["restarts"] == 0 and trainer.suspends == []


async def test_rollout_replicas_scale_in_place_and_immutable_changes_are_refused(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "scale")
    sts_before = emulator.get_obj(STATEFULSETS, NS, n.trainer_name("scale"))

    await cluster.patch(job_path(NS, "scale"), {"spec": {"rollout": {"replicas": 3}}})
    await eventually(lambda: replicas(emulator, "scale") == (2, 3), what="rollout scaled")
    await eventually(lambda: status(emulator, "scale").get("rollout", {}).get("desired") == 3, what="desired 3")

    # Invalid (partial rollouts need maxStaleness >= 1): refused, the job keeps running as it was.
    await cluster.patch(job_path(NS, "scale"), {"spec": {"algorithm": {"partialRollouts": True}}})
    await eventually(lambda: cond(emulator, "scale", "InvalidSpec").get("reason") == "InvalidUpdate", what="bad edit")
    assert cond(emulator, "scale", "InvalidSpec")["message"].startswith("spec.algorithm.partialRollouts")
    await cluster.patch(job_path(NS, "scale"), {"spec": {"algorithm": {"partialRollouts": False}}})
    # Valid but not changeable while running.
    await cluster.patch(job_path(NS, "scale"), {"spec": {"trainer": {"replicas": 1}}})
    await eventually(lambda: cond(emulator, "scale", "InvalidSpec").get("reason") == "ImmutableFieldChanged",
                     what="refused")
    refused = cond(emulator, "scale", "InvalidSpec")
    assert refused["status"] == "True"
    assert "spec.trainer.replicas cannot change on a running job (running with 2, asked for 1)" in refused["message"]
    assert status(emulator, "scale")["phase"] == "Running"
    sts_after = emulator.get_obj(STATEFULSETS, NS, n.trainer_name("scale"))
    assert sts_after["spec"] == sts_before["spec"] and sts_after["metadata"]["resourceVersion"] == \
        sts_before["metadata"]["resourceVersion"], "the trainer was changed"

    await cluster.patch(job_path(NS, "scale"), {"spec": {"trainer": {"replicas": 2}}})
    await eventually(lambda: cond(emulator, "scale", "InvalidSpec").get("status") == "False", what="accepted again")


async def test_success_marks_succeeded_cleans_up_and_deletes_after_ttl(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "done", runPolicy={"ttlSecondsAfterFinished": 1})
    trainer.set(NS, "done", phase="completed", step=20, totalSteps=20, rewardMean=0.9)

    await eventually(lambda: status(emulator, "done").get("phase") == "Succeeded", what="Succeeded")
    st = status(emulator, "done")
    assert st["completionTime"] and st["progress"]["step"] == 20 and st["message"] == "trained 20/20 steps"
    await eventually(lambda: replicas(emulator, "done") == (0, 0), what="scaled down")
    # After the TTL the operator deletes the job; the acted-out garbage collector takes the children.
    await eventually(lambda: emulator.get_obj(GRPOJOBS, NS, "done") is None, timeout=20, what="job deleted")
    await eventually(lambda: not kids(emulator, "done") and not cluster.pods(NS, "done"), what="children collected")


async def test_invalid_spec_gives_InvalidSpec_with_the_field_path(emulator, cluster, operator, trainer):
    # Passes the CRD schema (types and bounds are fine) but not the cross-field rule.
    bad = job_manifest("bad", algorithm={"partialRollouts": True})
    await cluster.create(job_path(), bad)
    await eventually(lambda: cond(emulator, "bad", "InvalidSpec").get("status") == "True", what="InvalidSpec")
    c = cond(emulator, "bad", "InvalidSpec")
    assert c["message"].startswith("spec.algorithm.partialRollouts: needs algorithm.maxStaleness >= 1")
    assert status(emulator, "bad")["phase"] == "Failed"
    # A type error the API server would have caught, had the CRD been applied without validation.
    await cluster.create(job_path(), job_manifest("typo", trainer={"replicas": "two"}))
    await eventually(lambda: "spec.trainer.replicas: must be an integer" in cond(emulator, "typo", "InvalidSpec").get("message", ""),
                     what="typo reported")
    # The operator is not stuck: a good job still gets its children, and fixing the spec recovers.
    await cluster.create(job_path(), job_manifest("good"))
    await eventually(lambda: len(kids(emulator, "good")) == 7, what="good job children")
    assert not kids(emulator, "bad") and not kids(emulator, "typo")
    await cluster.patch(job_path(NS, "bad"), {"spec": {"algorithm": {"maxStaleness": 1}}})
    await eventually(lambda: len(kids(emulator, "bad")) == 7, what="children after the fix")
    await eventually(lambda: cond(emulator, "bad", "InvalidSpec").get("status") == "False", what="valid again")
    assert status(emulator, "bad")["phase"] in ("Pending", "Initializing")
    await eventually(lambda: ("Warning", "InvalidSpec") in events(emulator, "bad"), what="event")


def hold_first_statefulset_create(emulator: Emulator) -> list:
    """A hook: the first StatefulSet create reaches the store, but its response never comes back
    (an operator stopped or killed mid-reconcile waits on it). Returns the held requests."""
    held: list = []

    async def land_but_never_answer(request) -> None:
        if request.resource == STATEFULSETS and request.action == kmock.action.CREATE and not held:
            held.append(request)
            async with emulator.post(request.url.path, json=request.data):
                pass
            await asyncio.Event().wait()
    emulator.hooks.append(land_but_never_answer)
    return held


async def test_operator_restart_mid_reconcile_converges_without_duplicates(emulator, cluster, kubeconfig,
                                                                           operator_config, trainer):
    held = hold_first_statefulset_create(emulator)

    first = await OperatorThread(operator_config()).start()
    await cluster.create(job_path(), job_manifest("restart"))
    await eventually(lambda: held, what="StatefulSet create in flight")
    await first.stop()  # the operator dies mid-reconcile, waiting for that answer
    assert emulator.get_obj(STATEFULSETS, NS, n.trainer_name("restart")) is not None
    assert emulator.get_obj(DEPLOYMENTS, NS, n.rollout_name("restart")) is None

    second = await OperatorThread(operator_config()).start()
    try:
        await eventually(lambda: cond(emulator, "restart", "Created").get("status") == "True", what="converged")
    finally:
        await second.stop()
    assert sorted(kids(emulator, "restart")) == sorted(children.key(o) for o in children.build(
        parse(job_manifest("restart")), namespace=NS))
    for res in CHILD_RESOURCES:  # every child created once: nothing re-posted, nothing duplicated
        names = [r.data["metadata"]["name"] for r in emulator.requests_for(res, "create") if r not in held]
        assert len(names) == len(set(names)), f"{res.plural} created twice: {names}"


async def test_api_conflicts_and_server_errors_are_retried(emulator, cluster, operator, trainer):
    conflicts = fail_next(emulator, "update", GRPOJOBS, status=409, times=2)
    errors = fail_next(emulator, "create", DEPLOYMENTS, status=503, times=1)
    await cluster.create(job_path(), job_manifest("retry"))
    await eventually(lambda: cond(emulator, "retry", "Created").get("status") == "True", what="Created")
    assert len(conflicts) == 2 and len(errors) == 1
    assert emulator.get_obj(DEPLOYMENTS, NS, n.rollout_name("retry")) is not None


async def test_an_operator_for_one_namespace_leaves_the_others_alone(emulator, cluster, kubeconfig, operator_config):
    await cluster.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    op = await OperatorThread(operator_config(), namespaces=(NS,)).start()
    try:
        await cluster.create(job_path("elsewhere"), job_manifest("other", ns="elsewhere"))
        await cluster.create(job_path(), job_manifest("mine"))
        await eventually(lambda: cond(emulator, "mine", "Created").get("status") == "True", what="watched job")
        await asyncio.sleep(1.0)  # several timer periods: the other job would have been reconciled
    finally:
        await op.stop()
    assert not (emulator.get_obj(GRPOJOBS, "elsewhere", "other") or {}).get("status")
    assert not kids(emulator, "other", "elsewhere")


async def test_fifty_jobs_created_at_once_all_reach_their_children(emulator, cluster, kubeconfig, operator_config):
    cluster.make_pods = False  # children only: this is about the operator keeping up
    op = await OperatorThread(operator_config(interval=2.0)).start()
    try:
        names = [f"many-{i:02d}" for i in range(50)]
        await asyncio.gather(*(cluster.create(job_path(), job_manifest(name)) for name in names))
        await eventually(lambda: all(len(kids(emulator, name)) == 7 for name in names), timeout=90,
                         period=0.5, what="children of 50 jobs")
        await eventually(lambda: all(cond(emulator, name, "Created").get("status") == "True" for name in names),
                         timeout=60, period=0.5, what="50 jobs Created")
    finally:
        await op.stop()
    for res in CHILD_RESOURCES:
        objs = emulator.live(res, NS)
        assert len(objs) == (100 if res in (SERVICES, NETWORKPOLICIES) else 50)
        for o in objs:
            owner = o["metadata"]["ownerReferences"][0]
            assert emulator.get_obj(GRPOJOBS, NS, owner["name"])["metadata"]["uid"] == owner["uid"]


async def test_every_request_of_the_operator_is_allowed_by_its_rbac_rules(emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "rbac", runPolicy={"ttlSecondsAfterFinished": 0})
    trainer.set(NS, "rbac", phase="completed", step=20)
    await eventually(lambda: emulator.get_obj(GRPOJOBS, NS, "rbac") is None, what="deleted after TTL")
    used = calls_made(emulator)
    assert used >= {("grpojob.io", "grpojobs/status", "patch"), ("apps", "statefulsets", "create"),
                    ("", "events", "create"), ("grpojob.io", "grpojobs", "delete")}
    assert [u for u in used if not allows(*u)] == []
