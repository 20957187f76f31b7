"""A GRPOJob becomes Kubernetes objects: pure functions, no API calls.

Commands, environment and ports come from `grpojob.plan.roles` (the one renderer `grpojob run` uses
too); this module only decides where those processes run: a trainer StatefulSet behind a headless
Service, a rollout Deployment behind a Service, the runtime config in a ConfigMap, and optional gang
scheduling and monitoring objects.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from grpojob import plan
from grpojob.api import API_VERSION, KIND, FieldError, GRPOJob
from grpojob.api.spec import WorkloadSpec

from . import names as n

Manifest = dict[str, Any]

# The trainer checkpoints on SIGTERM before it exits; give it time to write a large model.
TRAINER_GRACE_SECONDS = 300
ROLLOUT_GRACE_SECONDS = 30
# vLLM may load a large model for many minutes before /healthz answers.
ROLLOUT_STARTUP_SECONDS = 1800

VOLCANO_API = "scheduling.volcano.sh/v1beta1"
PODMONITOR_API = "monitoring.coreos.com/v1"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"


@dataclass(frozen=True)
class Scale:
    """Pods wanted per workload (zero while suspended or after cleanup)."""
    trainer: int
    rollout: int


def checkpoint_dir(job: GRPOJob) -> str:
    """spec.checkpoint.path in the pods; a relative path (the local default) lives in the run dir."""
    path = job.spec.checkpoint.path
    return path if path.startswith("/") else f"{n.RUN_DIR}/{path}"


def placement(job: GRPOJob, namespace: str) -> plan.Placement:
    """Where the plan's processes run on a cluster (the local runner has its own Placement)."""
    return plan.Placement(
        trainer_host=n.trainer_host(job.metadata.name, namespace),
        config_path=f"{n.CONFIG_DIR}/{plan.CONFIG_FILE}",
        checkpoint_dir=checkpoint_dir(job),
        run_dir=n.RUN_DIR,
    )


def cluster_errors(job: GRPOJob) -> list[FieldError]:
    """Spec problems that only exist on a cluster (the local runner shares one filesystem)."""
    spec = job.spec
    errors = []
    if spec.weight_sync.backend == "checkpoint" and not spec.checkpoint.volume_claim:
        errors.append(FieldError("spec.checkpoint.volumeClaim", "required when weightSync.backend is "
                                 "checkpoint: rollout pods read the trainer's checkpoints from it"))
    return errors


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def spec_hash(obj: Manifest) -> str:
    body = copy.deepcopy(obj)
    meta = body.get("metadata", {})
    meta.get("annotations", {}).pop(n.ANN_HASH, None)
    if meta.get("annotations") == {}:
        del meta["annotations"]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _meta(job: str, namespace: str, name: str, component: str,
          owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {**n.common_labels(job), n.LABEL_COMPONENT: component}}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def _quantities(values: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in values.items()}


def _resources(w: WorkloadSpec) -> dict[str, Any]:
    out = {}
    if w.resources.requests:
        out["requests"] = _quantities(w.resources.requests)
    if w.resources.limits:
        out["limits"] = _quantities(w.resources.limits)
    return out


_PER_REPLICA_SOURCES = {
    plan.REPLICA_INDEX: {"fieldRef": {"fieldPath": f"metadata.labels['{n.POD_INDEX_LABEL}']"}},
    plan.REPLICA_HOST: {"fieldRef": {"fieldPath": "status.podIP"}},
    plan.REPLICA_NAME: {"fieldRef": {"fieldPath": "metadata.name"}},
}


def container_env(role: plan.Role, w: WorkloadSpec) -> list[dict[str, Any]]:
    """The plan's environment verbatim, per-replica values from the downward API, then the user's
    extra variables (a user variable with a plan name replaces it in place)."""
    env: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in role.env.items()}
    for key, source in role.per_replica_env.items():
        env[key] = {"name": key, "valueFrom": copy.deepcopy(_PER_REPLICA_SOURCES[source])}
    for var in w.env:
        item: dict[str, Any] = {"name": var.name}
        if var.value_from is not None:
            item["valueFrom"] = var.value_from
        else:
            item["value"] = var.value or ""
        env[var.name] = item
    return list(env.values())


def _gang(job: GRPOJob) -> tuple[dict[str, str], dict[str, str], Optional[str]]:
    """Pod labels, pod annotations and scheduler name for the job's gang-scheduling choice."""
    s = job.spec.scheduling
    total = job.spec.trainer.replicas + job.spec.rollout.replicas
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    scheduler = s.scheduler_name
    if s.gang == "kueue":
        labels[KUEUE_GROUP] = job.metadata.name
        if s.queue_name:
            labels[KUEUE_QUEUE] = s.queue_name
        annotations[KUEUE_TOTAL] = str(total)
    elif s.gang == "volcano":
        annotations[VOLCANO_GROUP] = job.metadata.name
        scheduler = scheduler or "volcano"
    return labels, annotations, scheduler


def _pod_spec(job: GRPOJob, w: WorkloadSpec, container: dict[str, Any], volumes: list[dict[str, Any]],
              grace: int, scheduler: Optional[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,  # one job's pods need no env vars for every Service in the namespace
        "terminationGracePeriodSeconds": grace,
    }
    if w.node_selector:
        spec["nodeSelector"] = dict(w.node_selector)
    if w.tolerations:
        spec["tolerations"] = copy.deepcopy(w.tolerations)
    if w.affinity:
        spec["affinity"] = copy.deepcopy(w.affinity)
    if w.priority_class_name:
        spec["priorityClassName"] = w.priority_class_name
    if w.service_account_name:
        spec["serviceAccountName"] = w.service_account_name
    if scheduler:
        spec["schedulerName"] = scheduler
    return spec


def _common_volumes(job: GRPOJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    name = job.metadata.name
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": n.config_name(name)}},
        {"name": "run", "emptyDir": {}},
        # NCCL and vLLM move tensors through /dev/shm; the container default (64 MiB) is too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": n.CONFIG_DIR, "readOnly": True},
        {"name": "run", "mountPath": n.RUN_DIR},
        {"name": "dshm", "mountPath": n.SHM_DIR},
    ]
    if job.spec.model.volume_claim:
        volumes.append({"name": "models", "persistentVolumeClaim": {
            "claimName": job.spec.model.volume_claim, "readOnly": True}})
        mounts.append({"name": "models", "mountPath": n.MODELS_DIR, "readOnly": True})
    return volumes, mounts


def _pod_template(job: GRPOJob, role: str, w: WorkloadSpec, pod_spec: dict[str, Any]) -> dict[str, Any]:
    gang_labels, gang_annotations, _ = _gang(job)
    labels = {**w.labels, **gang_labels, **n.common_labels(job.metadata.name),
              n.LABEL_COMPONENT: role, n.LABEL_ROLE: role}
    meta: dict[str, Any] = {"labels": labels}
    annotations = {**w.annotations, **gang_annotations}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": pod_spec}


def _ports(role: plan.Role) -> list[dict[str, Any]]:
    return [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in role.ports.items()]


def config_map(job: GRPOJob, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    name = job.metadata.name
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(name, namespace, n.config_name(name), "config", owner),
            "data": {plan.CONFIG_FILE: plan.render_config(job)}}


def trainer_service(job: GRPOJob, role: plan.Role, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    name = job.metadata.name
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(name, namespace, n.trainer_name(name), "trainer", owner),
            "spec": {
                "clusterIP": "None",
                # torchrun's rendezvous on pod 0 must resolve before any trainer pod is ready.
                "publishNotReadyAddresses": True,
                "selector": n.selector(name, "trainer"),
                "ports": [{"name": p, "port": port, "targetPort": p, "protocol": "TCP"}
                          for p, port in role.ports.items()],
            }}


def _container(name: str, role: plan.Role, w: WorkloadSpec, image: str, mounts: list[dict[str, Any]],
               probes: dict[str, Any]) -> dict[str, Any]:
    """A role's container: the plan's command, env and ports verbatim, the user's image/resources."""
    container: dict[str, Any] = {
        "name": name,
        "image": w.image or image,
        "imagePullPolicy": w.image_pull_policy,
        "command": list(role.command),
        "env": container_env(role, w),
        "ports": _ports(role),
        "volumeMounts": mounts,
        **probes,
    }
    resources = _resources(w)
    if resources:
        container["resources"] = resources
    return container


def trainer_statefulset(job: GRPOJob, role: plan.Role, namespace: str, image: str, replicas: int,
                        owner: Optional[dict[str, Any]]) -> Manifest:
    name, spec = job.metadata.name, job.spec
    w = spec.trainer
    volumes, mounts = _common_volumes(job)
    if spec.checkpoint.volume_claim:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {
            "claimName": spec.checkpoint.volume_claim}})
    else:  # survives container restarts, not pod deletion: mount a claim to resume after suspend
        volumes.append({"name": "checkpoints", "emptyDir": {}})
    mounts.append({"name": "checkpoints", "mountPath": checkpoint_dir(job)})
    container = _container("trainer", role, w, image, mounts, {
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                           "periodSeconds": 10, "failureThreshold": 3},
    })
    _, _, scheduler = _gang(job)
    pod = _pod_spec(job, w, container, volumes, TRAINER_GRACE_SECONDS, scheduler)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(name, namespace, n.trainer_name(name), "trainer", owner),
            "spec": {
                "serviceName": n.trainer_name(name),
                "replicas": replicas,
                "podManagementPolicy": "Parallel",  # all nodes must start together for rendezvous
                "selector": {"matchLabels": n.selector(name, "trainer")},
                "template": _pod_template(job, "trainer", w, pod),
            }}


def rollout_service(job: GRPOJob, role: plan.Role, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    name = job.metadata.name
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(name, namespace, n.rollout_name(name), "rollout", owner),
            "spec": {
                "selector": n.selector(name, "rollout"),
                "ports": [{"name": "http", "port": role.ports["http"], "targetPort": "http", "protocol": "TCP"}],
            }}


def rollout_deployment(job: GRPOJob, role: plan.Role, namespace: str, image: str, replicas: int,
                       owner: Optional[dict[str, Any]]) -> Manifest:
    name, spec = job.metadata.name, job.spec
    w = spec.rollout
    volumes, mounts = _common_volumes(job)
    if spec.weight_sync.backend == "checkpoint" and spec.checkpoint.volume_claim:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {
            "claimName": spec.checkpoint.volume_claim, "readOnly": True}})
        mounts.append({"name": "checkpoints", "mountPath": checkpoint_dir(job), "readOnly": True})
    container = _container("rollout", role, w, image, mounts, {
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": ROLLOUT_STARTUP_SECONDS // 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 15,
                          "failureThreshold": 4},
        # Ready only once it serves the current policy's weights.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
    })
    _, _, scheduler = _gang(job)
    pod = _pod_spec(job, w, container, volumes, ROLLOUT_GRACE_SECONDS, scheduler)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(name, namespace, n.rollout_name(name), "rollout", owner),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": n.selector(name, "rollout")},
                "template": _pod_template(job, "rollout", w, pod),
            }}


def volcano_podgroup(job: GRPOJob, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    name, spec = job.metadata.name, job.spec
    pg: dict[str, Any] = {"minMember": spec.trainer.replicas + spec.rollout.replicas}
    if spec.scheduling.queue_name:
        pg["queue"] = spec.scheduling.queue_name
    if spec.trainer.priority_class_name:
        pg["priorityClassName"] = spec.trainer.priority_class_name
    return {"apiVersion": VOLCANO_API, "kind": "PodGroup",
            "metadata": _meta(name, namespace, name, "scheduling", owner), "spec": pg}


def pod_monitor(job: GRPOJob, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    name = job.metadata.name
    return {"apiVersion": PODMONITOR_API, "kind": "PodMonitor",
            "metadata": _meta(name, namespace, name, "monitoring", owner),
            "spec": {"selector": {"matchLabels": {n.LABEL_JOB: name}},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}]}}


def build(job: GRPOJob, *, namespace: str, image: Optional[str] = None,
          owner: Optional[dict[str, Any]] = None, scale: Optional[Scale] = None) -> list[Manifest]:
    """Every child object of the job, in creation order, each stamped with its spec hash."""
    if job.metadata.namespace != namespace:  # the plan's env and the config name the namespace
        job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})})
    image = n.runtime_image(image)
    scale = scale or Scale(job.spec.trainer.replicas, job.spec.rollout.replicas)
    trainer, rollout = plan.roles(job, placement(job, namespace))
    objs = [
        config_map(job, namespace, owner),
        trainer_service(job, trainer, namespace, owner),
        rollout_service(job, rollout, namespace, owner),
    ]
    if job.spec.scheduling.gang == "volcano":  # before the pods, so none schedules without its group
        objs.append(volcano_podgroup(job, namespace, owner))
    objs += [
        trainer_statefulset(job, trainer, namespace, image, scale.trainer, owner),
        rollout_deployment(job, rollout, namespace, image, scale.rollout, owner),
    ]
    if job.spec.monitoring.pod_monitor:
        objs.append(pod_monitor(job, namespace, owner))
    for obj in objs:
        obj["metadata"].setdefault("annotations", {})[n.ANN_HASH] = spec_hash(obj)
    return objs


def key(obj: Manifest) -> tuple[str, str]:
    """Identity of a child inside its job: (kind, name)."""
    return obj["kind"], obj["metadata"]["name"]
