"""The job's NetworkPolicies as a CNI would enforce them, ACTED OUT by tests/helpers/netpol.py (no
cluster or CNI here): the rendered policies' selectors against the labels of the pods the
operator renders, and of other tenants' pods, port by port. The policies also pass
kubernetes-validate --strict (test_children, test_render)."""
from __future__ import annotations

import pytest

from grpojob.api import parse
from grpojob_operator import children, network
from grpojob_operator import names as n
from tests.helpers.k8s_schema import validate_all
from tests.helpers.netpol import Pod, allowed, matches

from .conftest import NS, job_manifest

OPERATOR_NS = "grpojob-system"
EPHEMERAL = 41234  # a port a collective group's connection picks


def render(**spec) -> list[dict]:
    job = parse(job_manifest("j", **spec))
    return children.build(job, namespace=NS, cluster=children.Cluster(operator_namespace=OPERATOR_NS))


def pod_of(objs: list[dict], kind: str, name: str = "") -> Pod:
    """A pod as the workload controller makes it from the rendered template."""
    (obj,) = [o for o in objs if o["kind"] == kind]
    t = obj["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
    return Pod(NS, dict(t["metadata"]["labels"]), ports, name or obj["metadata"]["name"] + "-0")


@pytest.fixture
def scene():
    objs = render(network={"agentNamespaces": ["agents"]})
    other = render()  # another job in the same namespace, its own policies aside
    other_trainer = pod_of(other, "StatefulSet")
    other_trainer = Pod(NS, {**other_trainer.labels, n.LABEL_JOB: "k", n.LABEL_INSTANCE: "k"}, {}, "k-trainer-0")
    pods = {
        "trainer": pod_of(objs, "StatefulSet"), "rollout": pod_of(objs, "Deployment"),
        "other job's trainer": other_trainer,
        "unrelated pod, same namespace": Pod(NS, {"app": "notebook"}),
        "operator": Pod(OPERATOR_NS, {"app.kubernetes.io/component": "operator"}),
        "prometheus": Pod("monitoring", {"app": "prometheus"}),
        "agent": Pod("agents", {"app": "agent"}),
        "other tenant": Pod("tenant-b", {"app": "x"}),
    }
    return [o for o in objs if o["kind"] == "NetworkPolicy"], pods


def reach(policies, pods, dst: str, port: int) -> set[str]:
    return {name for name, src in pods.items() if name != dst and allowed(policies, src, pods[dst], port)}


def test_the_acted_out_semantics_are_the_api_references():
    """Guards the acting itself: deny-all, allow-all, AND within a peer, OR across peers, ports."""
    web = Pod("a", {"app": "web"}, {"http": 80})
    same, elsewhere = Pod("a", {"app": "db"}), Pod("b", {"app": "db"})

    def pol(ingress):
        return [{"metadata": {"namespace": "a"}, "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                                                          "policyTypes": ["Ingress"], "ingress": ingress}}]
    assert allowed([], same, web, 80) and allowed([], elsewhere, web, 1)  # no policy: open
    assert not allowed(pol([]), same, web, 80)
    assert allowed(pol([{}]), elsewhere, web, 9999)
    both = [{"from": [{"podSelector": {"matchLabels": {"app": "db"}},
                       "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]}]
    assert allowed(pol(both), elsewhere, web, 80) and not allowed(pol(both), same, web, 80)
    either = [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}},
                        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]}]
    assert allowed(pol(either), elsewhere, web, 80) and allowed(pol(either), same, web, 80)
    named = [{"ports": [{"port": "http"}]}]
    assert allowed(pol(named), same, web, 80) and not allowed(pol(named), same, web, 81)
    assert matches({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db"]}]}, same.labels)
    assert not matches({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, same.labels)


def test_trainer_ports_take_the_jobs_pods_and_the_operator_and_metrics_the_monitoring(scene):
    policies, pods = scene
    http, sync, rdzv = (pods["trainer"].ports[p] for p in ("http", "sync", "rendezvous"))
    assert reach(policies, pods, "trainer", http) == {"rollout", "operator", "prometheus"}
    for port in (sync, rdzv, EPHEMERAL):  # the weight-sync store, torchrun, the collectives
        assert reach(policies, pods, "trainer", port) == {"rollout"}, port
    # Trainer ranks reach each other on every port (pod 1 to pod 0).
    rank1 = Pod(NS, pods["trainer"].labels, {}, "j-trainer-1")
    assert all(allowed(policies, rank1, pods["trainer"], p) for p in (rdzv, sync, EPHEMERAL))


def test_rollout_ports_take_the_trainer_agents_and_the_monitoring_only(scene):
    policies, pods = scene
    http = pods["rollout"].ports["http"]
    assert reach(policies, pods, "rollout", http) == {"trainer", "agent", "prometheus"}
    assert reach(policies, pods, "rollout", EPHEMERAL) == {"trainer"}  # weight-sync groups
    # The operator never calls the rollout servers; another job's trainer cannot push to them.
    assert not allowed(policies, pods["other job's trainer"], pods["rollout"], EPHEMERAL)


def test_environment_pods_reach_the_rollout_http_port_once_their_role_is_listed(scene, monkeypatch):
    """The hook the environments (issue 14) use: their role in network.HTTP_CLIENT_ROLES."""
    monkeypatch.setattr(network, "HTTP_CLIENT_ROLES", ("trainer", "environment"))
    objs = render()
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    rollout = pod_of(objs, "Deployment")
    env_pod = Pod(NS, {**rollout.labels, n.LABEL_ROLE: "environment"}, {}, "j-environment-0")
    assert allowed(policies, env_pod, rollout, rollout.ports["http"])
    assert not allowed(policies, env_pod, rollout, EPHEMERAL)
    trainer = pod_of(objs, "StatefulSet")
    assert allowed(policies, env_pod, trainer, trainer.ports["http"])  # the trajectory API
    for port in ("sync", "rendezvous"):  # it holds the token, but never reaches the weights
        assert not allowed(policies, env_pod, trainer, trainer.ports[port])
    assert validate_all(policies) == 2


def test_the_jobs_monitoring_namespaces_replace_the_operators(scene):
    objs = render(network={"monitoringNamespaces": ["prom"]})
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    trainer, rollout = pod_of(objs, "StatefulSet"), pod_of(objs, "Deployment")
    for dst in (trainer, rollout):
        assert allowed(policies, Pod("prom", {}), dst, dst.ports["http"])
        assert not allowed(policies, Pod("monitoring", {}), dst, dst.ports["http"])
        assert not allowed(policies, Pod("prom", {}), dst, EPHEMERAL)
    none = [o for o in render(network={"monitoringNamespaces": []}) if o["kind"] == "NetworkPolicy"]
    assert not allowed(none, Pod("monitoring", {}), trainer, trainer.ports["http"])


def test_turned_off_nothing_is_rendered_and_everything_is_reachable():
    objs = render(network={"policy": False})
    assert not [o for o in objs if o["kind"] == "NetworkPolicy"]
    trainer = pod_of(objs, "StatefulSet")
    assert allowed([], Pod("tenant-b", {}), trainer, trainer.ports["sync"])  # the token is all that is left
