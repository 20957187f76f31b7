"""spec.judges on a cluster: a Deployment and a Service per judge, owned by the GRPOJob.

The judge's pods run the plan's `grpojob judge` role with the job's config and token (the same
volumes as the other roles, without the policy's model claim: a judge mounts its own volumeClaim at
/models), probes on /healthz (startup, liveness) and /readyz (model loaded), and the job's pod
security. They join the gang (gang.members) and get a NetworkPolicy of their own (network.py): only
the trainer pods and the monitoring namespaces reach their port. Nothing pushes weights to them.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from grpojob import plan
from grpojob.api import GRPOJob
from grpojob.api.judge import JudgeSpec

from . import names as n
from . import pods

ROLE = "judge"
LABEL_JUDGE = f"{n.GROUP}/judge"
GRACE_SECONDS = 30
STARTUP_SECONDS = 1800  # a large reward model loads for minutes
# The kinds of a judge's children, with their apiVersions (what a removed judge leaves to delete).
API_VERSIONS = {"Deployment": "apps/v1", "Service": "v1", "NetworkPolicy": "networking.k8s.io/v1"}


def name(job: str, judge: str) -> str:
    return f"{job}-{plan.judge_role_name(judge)}"


def selector(job: str, judge: str) -> dict[str, str]:
    return {**n.selector(job, ROLE), LABEL_JUDGE: judge}


def url(job: str, namespace: str, spec: JudgeSpec) -> str:
    return f"http://{name(job, spec.name)}.{namespace}.svc:{spec.port}"


def urls(job: GRPOJob, namespace: str) -> dict[str, tuple[str, ...]]:
    """Where the trainer reaches each judge: its Service (the placement's judge_urls)."""
    return {j.name: (url(job.metadata.name, namespace, j),) for j in job.spec.judges}


def _spec(job: GRPOJob, role: plan.Role) -> JudgeSpec:
    return next(j for j in job.spec.judges if j.name == role.judge)


def service(job: GRPOJob, role: plan.Role, meta: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    j = _spec(job, role)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": meta(name(job.metadata.name, j.name), ROLE, {LABEL_JUDGE: j.name}),
            "spec": {"selector": selector(job.metadata.name, j.name),
                     "ports": [{"name": "http", "port": j.port, "targetPort": "http", "protocol": "TCP"}]}}


def deployment(job: GRPOJob, role: plan.Role, image: str, replicas: int, base: list[tuple[Any, Any]],
               meta: Callable[..., dict[str, Any]], template: Callable[..., dict[str, Any]],
               scheduler: Optional[str]) -> dict[str, Any]:
    """`base`: the (volume, mount) pairs every pod of the job has; `meta(name, component, labels)`
    and `template(role, workload, pod)` are the children module's."""
    j = _spec(job, role)
    w = j.workload()
    if j.volume_claim:
        base = base + [({"name": pods.MODELS_VOLUME, "persistentVolumeClaim": {"claimName": j.volume_claim,
                                                                              "readOnly": True}},
                        {"name": pods.MODELS_VOLUME, "mountPath": n.MODELS_DIR, "readOnly": True})]
    volumes, mounts = pods.volumes(base, w)
    container = pods.container(ROLE, role, w, image, mounts, {
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": STARTUP_SECONDS // 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 15, "failureThreshold": 4},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
    })
    pod = pods.pod_spec(w, container, volumes, GRACE_SECONDS, scheduler, pods.init_containers(role, container))
    tmpl = template(ROLE, w, pod)
    tmpl["metadata"]["labels"][LABEL_JUDGE] = j.name
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": meta(name(job.metadata.name, j.name), ROLE, {LABEL_JUDGE: j.name}),
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector(job.metadata.name, j.name)},
                     "template": tmpl}}


def children(job: GRPOJob, roles: list[plan.Role], image: str, running: bool, base: list[tuple[Any, Any]],
             meta: Callable[..., dict[str, Any]], template: Callable[..., dict[str, Any]],
             scheduler: Optional[str]) -> list[dict[str, Any]]:
    """A Service and a Deployment per judge role; its pods run while the trainer's do (none while
    suspended or after cleanup)."""
    out = []
    for r in roles:
        out += [service(job, r, meta), deployment(job, r, image, r.replicas if running else 0, base, meta, template,
                                                  scheduler)]
    return out


def policy(job: GRPOJob, monitoring: list[str], meta: Any) -> Optional[dict[str, Any]]:
    """One NetworkPolicy over every judge pod of the job: their ports from the trainer pods (which
    score) and the monitoring namespaces (/metrics), nobody else."""
    if not job.spec.judges:
        return None
    name_ = job.metadata.name
    ports = [{"port": p, "protocol": "TCP"} for p in sorted({j.port for j in job.spec.judges})]
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": n.selector(name_, "trainer")}}],
                                      "ports": ports}]
    if monitoring:
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}
                                 for ns in dict.fromkeys(monitoring)], "ports": ports})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(n.policy_name(name_, ROLE)),
            "spec": {"podSelector": {"matchLabels": n.selector(name_, ROLE)}, "policyTypes": ["Ingress"],
                     "ingress": ingress}}


def stale(job: GRPOJob, owned: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of the job's judge children its spec no longer asks for: a judge
    removed from spec.judges leaves its Deployment and Service, the last one the NetworkPolicy.
    `owned`: (kind, name) of the children this job owns (its uid's, never another's)."""
    job_name = job.metadata.name
    wanted = {name(job_name, j.name) for j in job.spec.judges}
    prefix = name(job_name, "")
    out = []
    for kind, child in owned:
        if kind in ("Deployment", "Service") and child.startswith(prefix) and child not in wanted:
            out.append((API_VERSIONS[kind], kind, child))
        elif kind == "NetworkPolicy" and child == n.policy_name(job_name, ROLE) and not job.spec.judges:
            out.append((API_VERSIONS[kind], kind, child))
    return sorted(out, key=lambda o: (o[1] != "Deployment", o[1], o[2]))  # the pods' owner first
