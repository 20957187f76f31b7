"""A GRPOJob becomes Kubernetes objects: pure functions, no API calls.

Commands, environment and ports come from `grpojob.plan.roles` (the one renderer `grpojob run` uses
too); this module only decides where those processes run: a trainer StatefulSet behind a headless
Service, a rollout Deployment behind a Service (with spec.placement colocated: a second container of
the trainer pod instead), a Deployment per environment (spec.environments),
the runtime config in a ConfigMap, the job's NetworkPolicies (`network`), and optional gang
scheduling and monitoring objects. Every pod mounts the job's Secret (`token_secret`) read-only:
the token its endpoints require (grpojob.auth). The Secret is not among `build`'s children: its
token is made once, when the controller creates it, and never patched (the pods would lose it),
so it has no spec hash to keep.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Optional

from grpojob import auth, plan
from grpojob.api import API_VERSION, KIND, FieldError, GRPOJob, validate
from grpojob.api.operations import CODE_DIR, EPHEMERAL
from grpojob.api.spec import GROUP
from grpojob.api.workload import RESERVED_VOLUME_PREFIX, WorkloadSpec

from . import colocated, gang, judges, network, pods
from . import names as n

Manifest = dict[str, Any]

# The trainer pod's grace period is plan.TRAINER_GRACE_SECONDS (its one container may also run the engine).
ROLLOUT_GRACE_SECONDS = 30
ENVIRONMENT_GRACE_SECONDS = 30
# vLLM may load a large model for many minutes before /healthz answers.
ROLLOUT_STARTUP_SECONDS = 1800

VOLCANO_API = "scheduling.volcano.sh/v1beta1"
PODMONITOR_API = "monitoring.coreos.com/v1"


TOKEN_VOLUME = f"{RESERVED_VOLUME_PREFIX}token"
TOKEN_FILE_MODE = 0o440  # owner root, group fsGroup (the runtime user's group): readable by the pod's user
ANN_TOKEN = f"{GROUP}/token"
TOKEN_NOTE = ("made by the operator when it first creates the job's children, kept for the job's life and "
              "never patched")


@dataclass(frozen=True)
class Cluster:
    """What a job's children depend on beyond its spec: the operator's settings (the chart's values)."""
    operator_namespace: str = n.DEFAULT_OPERATOR_NAMESPACE  # may reach the trainer's HTTP port
    monitoring_namespaces: tuple[str, ...] = n.DEFAULT_MONITORING_NAMESPACES  # may reach the metrics ports
    metrics_auth: bool = False  # the pods' /metrics need the job's token too


@dataclass(frozen=True)
class Scale:
    """Pods wanted per workload (zero while suspended or after cleanup)."""
    trainer: int
    rollout: int


def checkpoint_dir(job: GRPOJob) -> str:
    """spec.checkpoint.path in the pods; a relative path (the local default) lives in the run dir;
    an object store's URL is itself."""
    path = job.spec.checkpoint.path
    return path if path.startswith("/") or job.spec.checkpoint.in_store else f"{n.RUN_DIR}/{path}"


def placement(job: GRPOJob, namespace: str, cluster: Cluster) -> plan.Placement:
    """Where the plan's processes run on a cluster (the local runner has its own Placement)."""
    return plan.Placement(
        trainer_host=n.trainer_host(job.metadata.name, namespace),
        config_path=f"{n.CONFIG_DIR}/{plan.CONFIG_FILE}",
        checkpoint_dir=checkpoint_dir(job),
        run_dir=n.RUN_DIR,
        # Environments reach every rollout server through the rollout Service.
        rollout_urls=(f"http://{n.rollout_name(job.metadata.name)}.{namespace}.svc:{job.spec.rollout.port}",),
        code_dir=CODE_DIR if job.spec.code.has_modules else None,
        site_dir=n.SITE_DIR if job.spec.code.pip else None,
        token_file=f"{n.TOKEN_DIR}/{auth.TOKEN_KEY}",
        metrics_auth=cluster.metrics_auth,
        judge_urls=judges.urls(job, namespace),
    )


def cluster_errors(job: GRPOJob) -> list[FieldError]:
    """Spec problems that only exist on a cluster (the local runner shares one filesystem)."""
    errors = validate.cluster_errors(job)
    if colocated.one_container(job):
        errors += colocated.one_container_errors(job)
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


def _meta(job: str, namespace: str, name: str, component: str, owner: Optional[dict[str, Any]],
          extra_labels: Optional[dict[str, str]] = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {**(extra_labels or {}), **n.common_labels(job), n.LABEL_COMPONENT: component}}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def _base_volumes(job: GRPOJob, model: bool = True) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(volume, mount) of every pod: the runtime config, the job's token, the scratch emptyDirs, the
    model claim (not in environments' pods: they reach the model through the rollout servers)."""
    pairs = [({"name": pods.CONFIG_VOLUME, "configMap": {"name": n.config_name(job.metadata.name)}},
              {"name": pods.CONFIG_VOLUME, "mountPath": n.CONFIG_DIR, "readOnly": True}),
             ({"name": TOKEN_VOLUME, "secret": {"secretName": n.token_name(job.metadata.name),
                                                "defaultMode": TOKEN_FILE_MODE}},
              {"name": TOKEN_VOLUME, "mountPath": n.TOKEN_DIR, "readOnly": True})]
    pairs += pods.scratch_volumes()
    if model and job.spec.model.volume_claim:
        pairs.append(({"name": pods.MODELS_VOLUME, "persistentVolumeClaim": {
            "claimName": job.spec.model.volume_claim, "readOnly": True}},
            {"name": pods.MODELS_VOLUME, "mountPath": n.MODELS_DIR, "readOnly": True}))
    return pairs + pods.code_volumes(job)


def _pod_template(job: GRPOJob, role: str, w: WorkloadSpec, pod_spec: dict[str, Any]) -> dict[str, Any]:
    gang_labels, gang_annotations = gang.pod_metadata(job, role)
    labels = {**w.labels, **gang_labels, **n.common_labels(job.metadata.name),
              n.LABEL_COMPONENT: role, n.LABEL_ROLE: role}
    meta: dict[str, Any] = {"labels": labels}
    annotations = {**w.annotations, **gang_annotations}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": pod_spec}


def token_secret(job: str, namespace: str, owner: Optional[dict[str, Any]], token: str,
                 note: str = TOKEN_NOTE) -> Manifest:
    """The job's Secret holding its token. Immutable: nobody, the operator included, changes a
    token the pods already read (so it is never made without one: it could never be filled)."""
    meta = _meta(job, namespace, n.token_name(job), "auth", owner)
    meta["annotations"] = {ANN_TOKEN: note}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "immutable": True,
            "data": {auth.TOKEN_KEY: base64.b64encode(token.encode()).decode()}}


def secret_token(obj: Manifest) -> Optional[str]:
    """The token a job's Secret holds (None when it holds none)."""
    raw = (obj.get("data") or {}).get(auth.TOKEN_KEY)
    if not raw:
        return None
    try:
        return base64.b64decode(raw).decode().strip() or None
    except (ValueError, UnicodeDecodeError):
        return None


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


def checkpoint_claim_template(job: GRPOJob) -> Optional[dict[str, Any]]:
    """The trainer StatefulSet's volumeClaimTemplate for checkpoints (checkpoint.storage persistent,
    no volumeClaim, no user volume mounted at the path), else None. Its controller makes one claim
    per pod, <template>-<statefulset>-<ordinal>, and keeps it when the pod goes: a suspended job
    resumes from its checkpoint (an emptyDir is deleted with its pod). Only pod 0 writes checkpoints;
    every pod gets a claim, as a StatefulSet's pods share one template."""
    c, w = job.spec.checkpoint, job.spec.trainer
    if c.volume_claim or c.storage == EPHEMERAL or c.in_store or \
            checkpoint_dir(job) in {m["mountPath"] for m in w.volume_mounts}:
        return None
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": c.size}}}
    if c.storage_class_name:
        spec["storageClassName"] = c.storage_class_name
    labels = {**n.common_labels(job.metadata.name), n.LABEL_COMPONENT: "checkpoints"}
    return {"metadata": {"name": pods.CHECKPOINTS_VOLUME, "labels": labels}, "spec": spec}


# Claims from the template stay while the StatefulSet scales to zero (suspend) and go with it (the
# job's deletion): https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#persistentvolumeclaim-retention
CLAIM_RETENTION = {"whenDeleted": "Delete", "whenScaled": "Retain"}


def dataset_secrets(job: GRPOJob) -> list[str]:
    """The Secrets named by spec.dataset.credentialsSecret, the evaluation set's and
    spec.checkpoint.credentialsSecret, once each: only the trainer reads data and writes
    checkpoints, so only its container gets them."""
    sets = [job.spec.dataset] + ([job.spec.evaluation.dataset] if job.spec.evaluation is not None else [])
    named = [d.credentials_secret for d in sets if d is not None] + [job.spec.checkpoint.credentials_secret]
    return list(dict.fromkeys(name for name in named if name))


def trainer_statefulset(job: GRPOJob, role: plan.Role, namespace: str, image: str, replicas: int,
                        owner: Optional[dict[str, Any]], engine: Optional[plan.Role] = None) -> Manifest:
    """`engine`: the rollout role of placement colocated, in each trainer pod (colocated.py)."""
    name, spec = job.metadata.name, job.spec
    w = spec.trainer
    template = checkpoint_claim_template(job)
    if template is not None:  # the StatefulSet controller adds the pod's claim as this volume
        source = None
    elif spec.checkpoint.volume_claim:
        source = {"name": pods.CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": spec.checkpoint.volume_claim}}
    else:  # checkpoint.storage ephemeral: survives container restarts, not the pod (suspend is refused)
        source = {"name": pods.CHECKPOINTS_VOLUME, "emptyDir": {}}
    checkpoints = [] if spec.checkpoint.in_store else [  # an object store needs no volume
        (source, {"name": pods.CHECKPOINTS_VOLUME, "mountPath": checkpoint_dir(job)})]
    volumes, mounts = pods.volumes(_base_volumes(job) + checkpoints, w)
    shared = engine is not None and colocated.one_container(job)
    if shared:  # the engine runs in this container, next to the trainer
        role = colocated.container_role(job, role, engine)
    container = pods.container("trainer", role, w, image, mounts, {
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                           "periodSeconds": 10, "failureThreshold": 3},
    })
    secrets = dataset_secrets(job)
    if secrets:  # the stores' credentials: every key of each Secret a variable (docs/data.md)
        container["envFrom"] = [{"secretRef": {"name": name}} for name in secrets]
    pod = pods.pod_spec(w, container, volumes, plan.TRAINER_GRACE_SECONDS, gang.scheduler(job),
                        pods.init_containers(role, container))
    if engine is not None and not shared:
        pod["containers"].append(colocated.engine_container(job, engine, image, mounts))
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": _meta(name, namespace, n.trainer_name(name), "trainer", owner),
            "spec": {
                "serviceName": n.trainer_name(name),
                "replicas": replicas,
                "podManagementPolicy": "Parallel",  # all nodes must start together for rendezvous
                "selector": {"matchLabels": n.selector(name, "trainer")},
                "template": _pod_template(job, "trainer", w, pod),
                **({"volumeClaimTemplates": [template], "persistentVolumeClaimRetentionPolicy": dict(CLAIM_RETENTION)}
                   if template is not None else {}),
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
    base = _base_volumes(job)
    if spec.weight_sync.backend == "checkpoint" and spec.checkpoint.volume_claim:
        base.append(({"name": pods.CHECKPOINTS_VOLUME, "persistentVolumeClaim": {
            "claimName": spec.checkpoint.volume_claim, "readOnly": True}},
            {"name": pods.CHECKPOINTS_VOLUME, "mountPath": checkpoint_dir(job), "readOnly": True}))
    volumes, mounts = pods.volumes(base, w)
    container = pods.container("rollout", role, w, image, mounts, {
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": ROLLOUT_STARTUP_SECONDS // 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 15,
                          "failureThreshold": 4},
        # Ready only once it serves the current policy's weights.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
    })
    pod = pods.pod_spec(w, container, volumes, ROLLOUT_GRACE_SECONDS, gang.scheduler(job),
                        pods.init_containers(role, container))
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(name, namespace, n.rollout_name(name), "rollout", owner),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": n.selector(name, "rollout")},
                "template": _pod_template(job, "rollout", w, pod),
            }}


def environment_deployment(job: GRPOJob, role: plan.Role, namespace: str, image: str, replicas: int,
                           owner: Optional[dict[str, Any]]) -> Manifest:
    """An environment's pods: its command with the plan's environment (OpenAI base URL, trajectory
    API, spec.code), spec.code.pip's init container, the same pod security as the other roles; no
    probes (the process is the user's)."""
    name, env = job.metadata.name, role.environment
    assert env is not None
    w = next(e for e in job.spec.environments if e.name == env).workload()
    volumes, mounts = pods.volumes(_base_volumes(job, model=False), w)
    container = pods.container("environment", role, w, image, mounts, {})
    if all(v["name"] != plan.ENV_OPENAI_API_KEY for v in container["env"]):  # a user's own key wins
        # The OpenAI convention for agents: the job's token as the API key, from the Secret (never a
        # literal value in the pod spec).
        container["env"].append({"name": plan.ENV_OPENAI_API_KEY, "valueFrom": {"secretKeyRef": {
            "name": n.token_name(name), "key": auth.TOKEN_KEY}}})
    pod = pods.pod_spec(w, container, volumes, ENVIRONMENT_GRACE_SECONDS, gang.scheduler(job),
                        pods.init_containers(role, container))
    template = _pod_template(job, plan.ENVIRONMENT_ROLE, w, pod)
    template["metadata"]["labels"][n.LABEL_ENVIRONMENT] = env
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(name, namespace, n.environment_name(name, env), plan.ENVIRONMENT_ROLE, owner,
                              {n.LABEL_ENVIRONMENT: env}),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": n.environment_selector(name, env)},
                "template": template,
            }}


def volcano_podgroup(job: GRPOJob, namespace: str, owner: Optional[dict[str, Any]]) -> Manifest:
    """The job's Volcano PodGroup: minMember trainer and rollout pods (gang.py)."""
    name, spec = job.metadata.name, job.spec
    pg: dict[str, Any] = {"minMember": gang.members(job)}
    if spec.scheduling.queue_name:
        pg["queue"] = spec.scheduling.queue_name
    if spec.trainer.priority_class_name:
        pg["priorityClassName"] = spec.trainer.priority_class_name
    return {"apiVersion": VOLCANO_API, "kind": "PodGroup",
            "metadata": _meta(name, namespace, gang.group_name(job), "scheduling", owner), "spec": pg}


def pod_monitor(job: GRPOJob, namespace: str, owner: Optional[dict[str, Any]], metrics_auth: bool) -> Manifest:
    name = job.metadata.name
    endpoint: dict[str, Any] = {"port": "http", "path": "/metrics"}
    if metrics_auth:  # Prometheus presents the job's token, read from the job's Secret
        endpoint["authorization"] = {"type": "Bearer", "credentials": {"name": n.token_name(name),
                                                                       "key": auth.TOKEN_KEY}}
    return {"apiVersion": PODMONITOR_API, "kind": "PodMonitor",
            "metadata": _meta(name, namespace, name, "monitoring", owner),
            "spec": {"selector": {"matchLabels": {n.LABEL_JOB: name}}, "podMetricsEndpoints": [endpoint]}}


def network_policies(job: GRPOJob, roles: dict[str, plan.Role], namespace: str, owner: Optional[dict[str, Any]],
                     cluster: Cluster) -> list[Manifest]:
    name = job.metadata.name
    return network.policies(job, roles, namespace, cluster.operator_namespace, cluster.monitoring_namespaces,
                            lambda policy: _meta(name, namespace, policy, "network", owner))


def build(job: GRPOJob, *, namespace: str, image: Optional[str] = None, owner: Optional[dict[str, Any]] = None,
          scale: Optional[Scale] = None, cluster: Optional[Cluster] = None) -> list[Manifest]:
    """Every child object of the job but its Secret, in creation order, each stamped with its spec hash."""
    if job.metadata.namespace != namespace:  # the plan's env and the config name the namespace
        job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})})
    image = n.runtime_image(image)
    cluster = cluster or Cluster()
    scale = scale or Scale(job.spec.trainer.replicas, job.spec.rollout.replicas)
    trainer, rollout, *others = plan.roles(job, placement(job, namespace, cluster))
    environments, judge_roles = [r for r in others if r.environment], [r for r in others if r.judge]
    objs = []
    if network.wanted(job):  # before the pods: none runs unguarded
        objs += network_policies(job, {"trainer": trainer, "rollout": rollout}, namespace, owner, cluster)
    engine_in_trainer_pod = rollout.pod_of == trainer.name  # spec.placement colocated: no rollout pods of their own
    objs += [config_map(job, namespace, owner), trainer_service(job, trainer, namespace, owner)]
    if not engine_in_trainer_pod:
        objs.append(rollout_service(job, rollout, namespace, owner))
    if job.spec.scheduling.gang == "volcano":  # before the pods, so none schedules without its group
        objs.append(volcano_podgroup(job, namespace, owner))
    objs.append(trainer_statefulset(job, trainer, namespace, image, scale.trainer, owner,
                                    engine=rollout if engine_in_trainer_pod else None))
    if not engine_in_trainer_pod:
        objs.append(rollout_deployment(job, rollout, namespace, image, scale.rollout, owner))
    # Environments feed the trainer: they run while it does (suspend and cleanup stop them too).
    objs += [environment_deployment(job, r, namespace, image, r.replicas if scale.trainer else 0, owner)
             for r in environments]
    objs += judges.children(job, judge_roles, image, scale.trainer > 0, _base_volumes(job, model=False),
                            lambda obj, c, labels=None: _meta(job.metadata.name, namespace, obj, c, owner, labels),
                            lambda role, w, pod: _pod_template(job, role, w, pod), gang.scheduler(job))
    if job.spec.monitoring.pod_monitor:
        objs.append(pod_monitor(job, namespace, owner, cluster.metrics_auth))
    for obj in objs:
        obj["metadata"].setdefault("annotations", {})[n.ANN_HASH] = spec_hash(obj)
    return objs


def key(obj: Manifest) -> tuple[str, str]:
    """Identity of a child inside its job: (kind, name)."""
    return obj["kind"], obj["metadata"]["name"]
