"""Issue 15 on the operator's side, end to end against kmock: each job's Secret (made once, owned,
immutable, mounted read-only, its token never anywhere else), the trainer called with it, the
job's NetworkPolicies kept in shape and removable, and RBAC that is exactly what the code calls.
The trainer stand-in (harness.TrainerStub) answers only the token in the job's Secret."""
from __future__ import annotations

import asyncio
import json
import logging

from grpojob import auth
from grpojob_operator import children, network, rbac, tokens
from grpojob_operator import names as n

from .cluster import eventually
from .conftest import NS, job_manifest, job_path, secret_token
from .harness import OperatorThread
from .kmock_shim import CONFIGMAPS, EVENTS, GRPOJOBS, NETWORKPOLICIES, SECRETS, STATEFULSETS
from .test_operator import calls_made, cond, kids, running, status


def secret(emu, job: str) -> dict:
    return emu.get_obj(SECRETS, NS, n.token_name(job))


def creates(emu, resource) -> list[str]:
    return [r.data["metadata"]["name"] for r in emu.requests_for(resource, "create")]


async def test_the_jobs_secret_is_made_once_mounted_read_only_and_its_token_goes_nowhere_else(
        emulator, cluster, operator, trainer, caplog):
    caplog.set_level(logging.DEBUG)
    await running(emulator, cluster, trainer, "sec")
    trainer.set(NS, "sec", step=3, rewardMean=0.5)
    await eventually(lambda: status(emulator, "sec").get("progress", {}).get("step") == 3, what="progress read")
    obj = secret(emulator, "sec")
    uid = emulator.get_obj(GRPOJOBS, NS, "sec")["metadata"]["uid"]
    assert obj["metadata"]["ownerReferences"] == [children.owner_reference("sec", uid)]
    assert obj["immutable"] is True and obj["type"] == "Opaque"
    token = secret_token(emulator)(NS, "sec")
    assert token and len(token) >= 40

    # Before any pod: the StatefulSet is created after the Secret its pods mount.
    order = [(r.resource, r.data["metadata"]["name"]) for r in list(emulator._requests)
             if r.action is not None and r.action.value.lower() == "create" and r.resource in (SECRETS, STATEFULSETS)]
    assert order[0] == (SECRETS, "sec-token")
    for role in ("trainer", "rollout"):
        for pod in cluster.pods(NS, "sec", role):
            spec = pod["spec"]
            (volume,) = [v for v in spec["volumes"] if "secret" in v]
            assert volume["secret"] == {"secretName": "sec-token", "defaultMode": 0o440}
            (c,) = spec["containers"]
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
            assert mount == {"name": volume["name"], "mountPath": n.TOKEN_DIR, "readOnly": True}
            env = {e["name"]: e for e in c["env"]}
            assert env[auth.ENV_TOKEN_FILE]["value"] == f"{n.TOKEN_DIR}/{auth.TOKEN_KEY}"
            assert spec["securityContext"]["fsGroup"] == n.RUNTIME_UID  # the group that may read 0440

    # Nowhere else: not in the job (status, annotations), its Events, any other object, the logs.
    await asyncio.sleep(0.5)  # a few more looks
    everything = [o for (res, ns, _), o in ((k, v.raw) for k, v in list(emulator.objects.items()))
                  if res != SECRETS]
    assert everything and token not in json.dumps(everything)
    assert token not in json.dumps(emulator.live(EVENTS, NS)) and emulator.live(CONFIGMAPS, NS)
    assert token not in caplog.text
    assert trainer.refused == [], "the operator called the trainer without the job's token"
    assert creates(emulator, SECRETS) == ["sec-token"], "the token must never be made twice"


async def test_the_token_survives_an_operator_restart_and_a_deleted_secret(
        emulator, cluster, kubeconfig, operator_config, trainer, monkeypatch):
    monkeypatch.setattr(tokens, "RECHECK_SECONDS", 0.5)
    first = await OperatorThread(operator_config()).start()
    try:
        await running(emulator, cluster, trainer, "keep")
        token = secret_token(emulator)(NS, "keep")
    finally:
        await first.stop()
    second = await OperatorThread(operator_config()).start()  # reads the token back from the Secret
    try:
        trainer.set(NS, "keep", step=5)
        await eventually(lambda: status(emulator, "keep").get("progress", {}).get("step") == 5, what="progress")
        await cluster.delete(f"/api/v1/namespaces/{NS}/secrets/{n.token_name('keep')}")
        await eventually(lambda: secret(emulator, "keep"), what="the Secret put back")
        assert secret_token(emulator)(NS, "keep") == token, "running pods hold the old token"
        trainer.set(NS, "keep", step=6)
        await eventually(lambda: status(emulator, "keep").get("progress", {}).get("step") == 6, what="progress")
    finally:
        await second.stop()
    assert creates(emulator, SECRETS) == ["keep-token", "keep-token"] and trainer.refused == []


async def test_a_secret_that_is_not_the_jobs_stops_it_with_the_reason(emulator, cluster, operator, trainer):
    await cluster.create(f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "squat-token", "namespace": NS},
        "data": {"token": "c2VjcmV0"}})
    await cluster.create(job_path(), job_manifest("squat"))
    await eventually(lambda: cond(emulator, "squat", "Created").get("status") == "False", what="refused")
    assert "Secret ml/squat-token exists and is not this GRPOJob's (controller: none); delete it" in \
        cond(emulator, "squat", "Created")["message"]
    assert not kids(emulator, "squat"), "no pod may start with someone else's token"
    await cluster.delete(f"/api/v1/namespaces/{NS}/secrets/squat-token")
    await eventually(lambda: len(kids(emulator, "squat")) == 7, what="children once it is gone")


def policies(emu, job: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in emu.live(NETWORKPOLICIES, NS)
            if o["metadata"]["labels"].get(n.LABEL_JOB) == job}


async def test_network_policies_follow_the_spec_are_put_back_and_can_be_turned_off(
        emulator, cluster, operator, trainer):
    await running(emulator, cluster, trainer, "net")
    assert set(policies(emulator, "net")) == set(network.names("net"))
    path = job_path(name="net")

    # A running job takes a new agent namespace in place.
    await cluster.patch(path, {"spec": {"network": {"agentNamespaces": ["agents"]}}})
    def agents_allowed():
        rules = policies(emulator, "net")["net-rollout"]["spec"]["ingress"]
        return any(p.get("namespaceSelector", {}).get("matchLabels", {}).get(network.NAMESPACE_LABEL) == "agents"
                   for r in rules for p in r["from"])
    await eventually(agents_allowed, what="the agents namespace allowed")

    # Someone opens the trainer's policy to everyone: the operator puts it back.
    policy_path = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/net-trainer"
    await cluster.patch(policy_path, {"spec": {"ingress": [{}]}})
    await eventually(lambda: policies(emulator, "net")["net-trainer"]["spec"]["ingress"] != [{}], what="put back")
    # ...and deleted, it comes back too.
    await cluster.delete(policy_path)
    await eventually(lambda: "net-trainer" in policies(emulator, "net"), what="re-created")

    await cluster.patch(path, {"spec": {"network": {"policy": False}}})
    await eventually(lambda: not policies(emulator, "net"), what="policies deleted")
    await asyncio.sleep(0.5)
    assert not policies(emulator, "net") and status(emulator, "net")["phase"] == "Running"


# Rules the scenario below does not call, each with where it is called.
ELSEWHERE = {
    ("grpojob.io", "grpojobs/finalizers", "update"): "not a call: OwnerReferencesPermissionEnforcement asks for it "
                                                     "(test_hardening acts it out)",
    ("scheduling.volcano.sh", "podgroups", "create"): "spec.scheduling.gang=volcano",
    ("scheduling.volcano.sh", "podgroups", "patch"): "spec.scheduling.gang=volcano, a drifted PodGroup",
    ("monitoring.coreos.com", "podmonitors", "create"): "spec.monitoring.podMonitor",
    ("monitoring.coreos.com", "podmonitors", "patch"): "spec.monitoring.podMonitor, a drifted PodMonitor",
    ("", "services", "patch"): "a drifted Service",
    ("", "configmaps", "patch"): "a spec change (covered: rollout scaling in test_operator)",
    ("apps", "statefulsets", "patch"): "suspend and resume (test_operator)",
    ("kopf.dev", "clusterkopfpeerings", "list"): "leader election (--peering)",
    ("kopf.dev", "clusterkopfpeerings", "watch"): "leader election (--peering)",
    ("kopf.dev", "clusterkopfpeerings", "patch"): "leader election (--peering)",
    ("kopf.dev", "clusterkopfpeerings", "get"): "leader election (--peering)",
    ("kopf.dev", "kopfpeerings", "list"): "leader election in namespaced mode",
    ("kopf.dev", "kopfpeerings", "watch"): "leader election in namespaced mode",
    ("kopf.dev", "kopfpeerings", "patch"): "leader election in namespaced mode",
    ("kopf.dev", "kopfpeerings", "get"): "leader election in namespaced mode",
    ("", "namespaces", "list"): "kopf, watching some namespaces (--namespace; test_operator)",
    ("", "namespaces", "watch"): "kopf, watching some namespaces (--namespace; test_operator)",
    ("", "services", "delete"): "a judge removed from spec.judges (test_judges_operator)",
    ("apps", "deployments", "delete"): "a judge removed from spec.judges (test_judges_operator)",
}
# Granted before issue 15 and called nowhere in this scenario nor, as far as kopf's code shows, by
# kopf (it lists, watches and patches; it does not get single objects): candidates for removal.
UNCALLED = {("grpojob.io", "grpojobs", "get"), ("grpojob.io", "grpojobs/status", "get")}


async def test_rbac_is_exactly_what_the_code_calls(emulator, cluster, operator, trainer):
    """Every request the operator makes is allowed (test_operator checks that too), and every rule
    it holds is called here, or named in ELSEWHERE with where it is: nothing granted for nothing.
    The chart's rules equal RBAC_RULES (tests/chart)."""
    await running(emulator, cluster, trainer, "rb", runPolicy={"ttlSecondsAfterFinished": 0})
    await cluster.patch(job_path(name="rb"), {"spec": {"rollout": {"replicas": 3}}})  # a Deployment patch
    await cluster.patch(f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/rb-rollout",
                        {"spec": {"ingress": [{}]}})
    await eventually(lambda: policies(emulator, "rb")["rb-rollout"]["spec"]["ingress"] != [{}], what="put back")
    await cluster.patch(job_path(name="rb"), {"spec": {"network": {"policy": False}}})  # deletes
    await eventually(lambda: not policies(emulator, "rb"), what="policies deleted")
    trainer.set(NS, "rb", phase="completed", step=20)
    await eventually(lambda: emulator.get_obj(GRPOJOBS, NS, "rb") is None, what="deleted after TTL")
    used = calls_made(emulator)
    granted = {(x.api_group, x.resource, v) for x in rbac.RBAC_RULES for v in x.verbs}
    assert {u for u in used if u not in granted} == set(), "calls without a rule"
    assert granted - used - set(ELSEWHERE) == UNCALLED, "rules the code does not call"
    assert ("", "secrets", "get") in used and ("", "secrets", "create") in used
    assert {("networking.k8s.io", "networkpolicies", v) for v in ("create", "patch", "delete", "watch")} <= used
    assert not {u for u in used if u[1] == "secrets" and u[2] in ("list", "watch", "patch", "delete")}
