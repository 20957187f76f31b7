"""Who may reach a job's pods: one NetworkPolicy per role (spec.network.policy, on by default).

Ingress only (egress stays the cluster's business). The kubelet's probes come from the pod's node,
which a NetworkPolicy always lets through.
- trainer pods: every port from the job's trainer and rollout pods (torchrun's rendezvous, the
  ranks' collectives, the weight-sync store, and the collective groups' connections, which either
  side may open on ports it picks); the HTTP port (/healthz /status /suspend /metrics, and the
  environments' trajectory API) from the job's other pods, the operator's namespace and the
  monitoring namespaces, and in spec.mode service (the training API) from the agentNamespaces. So an environment pod, which holds the job's token too, never reaches
  the weight-sync store: it cannot register for the weights.
- rollout pods: every port from the job's trainer pods (the weight-sync groups' connections,
  /generate); the HTTP port (/generate, the OpenAI endpoints, /metrics) from the job's pods of
  HTTP_CLIENT_ROLES, the spec's agentNamespaces and the monitoring namespaces.
Every endpoint but the probes also needs the job's token: the policy keeps everyone else from
even connecting (the weight-sync store itself authenticates no one).
"""
from __future__ import annotations

from typing import Any, Optional

from grpojob import plan
from grpojob.api import GRPOJob

from . import judges
from . import names as n

NETWORKING_API = "networking.k8s.io/v1"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace (k8s >= 1.21)
# The job's roles whose pods call the rollout servers' HTTP port (the trainer reaches every port):
# environments generate through the OpenAI endpoint.
HTTP_CLIENT_ROLES: tuple[str, ...] = ("trainer", plan.ENVIRONMENT_ROLE)
# The job's roles whose pods reach every trainer port (the others: its HTTP port only).
SYNC_ROLES: tuple[str, ...] = ("trainer", "rollout")


def _namespaces(names: list[str] | tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: ns}}} for ns in dict.fromkeys(names)]


def _roles(job: str, roles: tuple[str, ...]) -> dict[str, Any]:
    """A peer: the job's pods of these roles."""
    return {"podSelector": {"matchLabels": {n.LABEL_JOB: job},
                            "matchExpressions": [{"key": n.LABEL_ROLE, "operator": "In", "values": list(roles)}]}}


def _http(port: int) -> list[dict[str, Any]]:
    return [{"port": port, "protocol": "TCP"}]


def _policy(job: str, role: str, ingress: list[dict[str, Any]], meta: dict[str, Any]) -> dict:
    return {"apiVersion": NETWORKING_API, "kind": "NetworkPolicy", "metadata": meta,
            "spec": {"podSelector": {"matchLabels": n.selector(job, role)},
                     "policyTypes": ["Ingress"], "ingress": ingress}}


def policies(job: GRPOJob, roles: dict[str, plan.Role], namespace: str, operator_namespace: str,
             monitoring_namespaces: tuple[str, ...], meta: Any) -> list[dict[str, Any]]:
    """The job's NetworkPolicies; `meta(name)` makes each one's metadata."""
    name, net = job.metadata.name, job.spec.network
    monitoring = list(net.monitoring_namespaces if net.monitoring_namespaces is not None else monitoring_namespaces)
    trainer_http, rollout_http = roles["trainer"].ports["http"], roles["rollout"].ports["http"]

    trainer: list[dict[str, Any]] = [
        {"from": [_roles(name, SYNC_ROLES)]},
        {"from": [{"podSelector": {"matchLabels": {n.LABEL_JOB: name}}}], "ports": _http(trainer_http)},
        {"from": _namespaces([operator_namespace]), "ports": _http(trainer_http)},
    ]
    if job.spec.mode == "service" and net.agent_namespaces:  # the user's loop calls the training API
        trainer.append({"from": _namespaces(net.agent_namespaces), "ports": _http(trainer_http)})
    if monitoring:
        trainer.append({"from": _namespaces(monitoring), "ports": _http(trainer_http)})

    rollout: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": n.selector(name, "trainer")}}]}]
    clients = tuple(r for r in HTTP_CLIENT_ROLES if r != "trainer")
    if clients:
        rollout.append({"from": [_roles(name, clients)], "ports": _http(rollout_http)})
    if net.agent_namespaces:
        rollout.append({"from": _namespaces(net.agent_namespaces), "ports": _http(rollout_http)})
    if monitoring:
        rollout.append({"from": _namespaces(monitoring), "ports": _http(rollout_http)})
    judge = judges.policy(job, monitoring, meta)  # spec.judges: reached by the trainer pods only
    return [_policy(name, "trainer", trainer, meta(n.policy_name(name, "trainer"))),
            _policy(name, "rollout", rollout, meta(n.policy_name(name, "rollout"))), *([judge] if judge else [])]


def names(job: str) -> list[str]:
    return [n.policy_name(job, role) for role in n.ROLES]


def wanted(job: Optional[GRPOJob]) -> bool:
    return job is not None and job.spec.network.policy
