"""The Kubernetes permissions the operator uses, for the Helm chart's (Cluster)Role.

Each rule is (apiGroup, resource, verbs). The integration tests check that every request the
operator makes is covered here."""
from __future__ import annotations

from typing import NamedTuple

from grpojob.api.spec import GROUP, PLURAL


class Rule(NamedTuple):
    api_group: str
    resource: str
    verbs: tuple[str, ...]


RBAC_RULES: tuple[Rule, ...] = (
    # The jobs: watched by kopf, annotated (kopf progress, restart ledger), deleted after their TTL.
    Rule(GROUP, PLURAL, ("get", "list", "watch", "patch", "delete")),
    Rule(GROUP, f"{PLURAL}/status", ("get", "patch")),
    # Children carry blockOwnerDeletion on their owner reference to the job: with the API server's
    # OwnerReferencesPermissionEnforcement admission (OpenShift enables it) that needs this verb.
    Rule(GROUP, f"{PLURAL}/finalizers", ("update",)),
    # Children: watched into kopf indexes, created, and patched back into shape; a judge's
    # Deployment and Service are deleted when the judge leaves spec.judges.
    Rule("", "configmaps", ("list", "watch", "create", "patch")),
    Rule("", "services", ("list", "watch", "create", "patch", "delete")),
    Rule("apps", "statefulsets", ("list", "watch", "create", "patch")),
    Rule("apps", "deployments", ("list", "watch", "create", "patch", "delete")),
    Rule("", "pods", ("list", "watch")),
    # Each job's token: its Secret is created once and read back (after an operator restart, to
    # call the trainer with it); never patched, listed or watched. RBAC cannot narrow `get` to the
    # Secrets the operator owns: watchNamespaces narrows it to the namespaces it serves.
    Rule("", "secrets", ("create", "get")),
    # Each job's NetworkPolicies (spec.network.policy): watched like the other children (an edited
    # or deleted one is put back), deleted when the job turns them off.
    Rule("networking.k8s.io", "networkpolicies", ("list", "watch", "create", "patch", "delete")),
    # Optional children (spec.scheduling.gang=volcano, spec.monitoring.podMonitor).
    Rule("scheduling.volcano.sh", "podgroups", ("create", "patch")),
    Rule("monitoring.coreos.com", "podmonitors", ("create", "patch")),
    # kopf itself: Events for transitions, CRD and namespace discovery, peering (leader election).
    Rule("", "events", ("create",)),
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),
    Rule("", "namespaces", ("list", "watch")),
    Rule("kopf.dev", "clusterkopfpeerings", ("list", "watch", "patch", "get")),
    Rule("kopf.dev", "kopfpeerings", ("list", "watch", "patch", "get")),
)


def allows(api_group: str, resource: str, verb: str) -> bool:
    return any(r.api_group == api_group and r.resource == resource and verb in r.verbs for r in RBAC_RULES)
