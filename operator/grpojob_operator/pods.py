"""The pod half of a child workload: container, environment, volumes and security context.

Pods pass PodSecurity `restricted` by default: non-root (the runtime image's uid), no privilege
escalation, every capability dropped, RuntimeDefault seccomp, and a read-only root filesystem with
an emptyDir at each place the runtime writes. The spec may override any of it: its security
contexts are merged key by key over these defaults, and a volume mount of its own at one of these
paths replaces the emptyDir there.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from grpojob import plan
from grpojob.api.operations import CODE_DIR
from grpojob.api.workload import RESERVED_VOLUME_PREFIX, WorkloadSpec

from . import names as n

Volume = dict[str, Any]
Mount = dict[str, Any]

POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": n.RUNTIME_UID,
    "runAsGroup": n.RUNTIME_UID,
    # Mounted claims (checkpoints) become writable by the runtime's group; OnRootMismatch skips
    # the recursive chown of a large model volume that already has it.
    "fsGroup": n.RUNTIME_UID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}

# Where the runtime writes, each an emptyDir (measured with strace on trainer, hf and vLLM rollout
# servers): $HOME holds the caches of Hugging Face, torch, Triton, vLLM and matplotlib; /tmp holds
# tempfiles, torchelastic's run files and vLLM's IPC sockets; /dev/shm the shared memory of NCCL,
# vLLM and multiprocessing (the container default of 64 MiB is too small).
SCRATCH: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (f"{RESERVED_VOLUME_PREFIX}home", n.HOME_DIR, {}),
    (f"{RESERVED_VOLUME_PREFIX}tmp", n.TMP_DIR, {}),
    (f"{RESERVED_VOLUME_PREFIX}run", n.RUN_DIR, {}),
    (f"{RESERVED_VOLUME_PREFIX}shm", n.SHM_DIR, {"medium": "Memory"}),
)
# Cache locations pinned inside $HOME, so an image that points one elsewhere (a read-only path)
# still writes into the emptyDir.
CACHE_ENV: dict[str, str] = {
    "HOME": n.HOME_DIR,
    "TMPDIR": n.TMP_DIR,
    "XDG_CACHE_HOME": f"{n.HOME_DIR}/.cache",
    "XDG_CONFIG_HOME": f"{n.HOME_DIR}/.config",
    "HF_HOME": f"{n.HOME_DIR}/.cache/huggingface",
    "TORCHINDUCTOR_CACHE_DIR": f"{n.HOME_DIR}/.cache/torchinductor",
    "TRITON_CACHE_DIR": f"{n.HOME_DIR}/.cache/triton",
    "VLLM_CACHE_ROOT": f"{n.HOME_DIR}/.cache/vllm",
}
CONFIG_VOLUME = f"{RESERVED_VOLUME_PREFIX}config"
MODELS_VOLUME = f"{RESERVED_VOLUME_PREFIX}models"
CHECKPOINTS_VOLUME = f"{RESERVED_VOLUME_PREFIX}checkpoints"
CODE_VOLUME = f"{RESERVED_VOLUME_PREFIX}code"  # spec.code.configMap (spec.code.volume keeps its own name)
SITE_VOLUME = f"{RESERVED_VOLUME_PREFIX}site"
INSTALL_CONTAINER = "install-code"

_PER_REPLICA_SOURCES = {
    plan.REPLICA_INDEX: {"fieldRef": {"fieldPath": f"metadata.labels['{n.POD_INDEX_LABEL}']"}},
    plan.REPLICA_HOST: {"fieldRef": {"fieldPath": "status.podIP"}},
    plan.REPLICA_NAME: {"fieldRef": {"fieldPath": "metadata.name"}},
}


def container_env(role: plan.Role, w: WorkloadSpec) -> list[dict[str, Any]]:
    """The cache locations, the plan's environment verbatim, per-replica values from the downward
    API, then the user's variables (one with a name already set replaces it in place)."""
    env: dict[str, dict[str, Any]] = {k: {"name": k, "value": v} for k, v in CACHE_ENV.items()}
    env.update({k: {"name": k, "value": v} for k, v in role.env.items()})
    for key, source in role.per_replica_env.items():
        env[key] = {"name": key, "valueFrom": copy.deepcopy(_PER_REPLICA_SOURCES[source])}
    for var in w.env:
        env[var["name"]] = copy.deepcopy(var)
    return list(env.values())


def _resources(w: WorkloadSpec) -> dict[str, Any]:
    out = copy.deepcopy(w.resources)
    for key in ("requests", "limits"):
        if key in out:  # quantities as strings: one rendering of "8" and 8
            out[key] = {k: str(v) for k, v in out[key].items()}
        if not out.get(key):
            out.pop(key, None)
    return out


def volumes(base: list[tuple[Optional[Volume], Mount]], w: WorkloadSpec) -> tuple[list[Volume], list[Mount]]:
    """The operator's (volume, mount) pairs, then the user's volumes and mounts; a user mount at
    the path of one of ours replaces it. A pair without a volume mounts a StatefulSet's claim
    template (its controller adds the volume to each pod)."""
    taken = {m["mountPath"] for m in w.volume_mounts}
    kept = [(v, m) for v, m in base if m["mountPath"] not in taken]
    return ([v for v, _ in kept if v is not None] + copy.deepcopy(w.volumes),
            [m for _, m in kept] + copy.deepcopy(w.volume_mounts))


def scratch_volumes() -> list[tuple[Volume, Mount]]:
    return [({"name": name, "emptyDir": dict(empty_dir)}, {"name": name, "mountPath": path})
            for name, path, empty_dir in SCRATCH]


def code_volumes(job) -> list[tuple[Volume, Mount]]:
    """spec.code in a pod: its modules read-only at CODE_DIR, an emptyDir for its pip requirements."""
    c = job.spec.code
    pairs = []
    if c.config_map is not None:
        pairs.append(({"name": CODE_VOLUME, "configMap": {"name": c.config_map}},
                      {"name": CODE_VOLUME, "mountPath": CODE_DIR, "readOnly": True}))
    elif c.volume is not None:
        pairs.append((copy.deepcopy(c.volume), {"name": c.volume["name"], "mountPath": CODE_DIR, "readOnly": True}))
    if c.pip:
        pairs.append(({"name": SITE_VOLUME, "emptyDir": {}}, {"name": SITE_VOLUME, "mountPath": n.SITE_DIR}))
    return pairs


def init_containers(role: plan.Role, main: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's setup step (spec.code.pip) before the main container: same image, environment,
    mounts and security context, no ports or probes."""
    if not role.setup:
        return []
    keep = ("image", "imagePullPolicy", "env", "volumeMounts", "securityContext")
    return [{"name": INSTALL_CONTAINER, "command": list(role.setup), **{k: copy.deepcopy(main[k]) for k in keep}}]


def pod_security(w: WorkloadSpec) -> dict[str, Any]:
    return {**copy.deepcopy(POD_SECURITY), **copy.deepcopy(w.pod_security_context or {})}


def container_security(w: WorkloadSpec) -> dict[str, Any]:
    return {**copy.deepcopy(CONTAINER_SECURITY), **copy.deepcopy(w.security_context or {})}


def container(name: str, role: plan.Role, w: WorkloadSpec, image: str, mounts: list[Mount],
              probes: dict[str, Any]) -> dict[str, Any]:
    """A role's container: the plan's command, env and ports verbatim, the user's image/resources."""
    out: dict[str, Any] = {
        "name": name,
        "image": w.image or image,
        "imagePullPolicy": w.image_pull_policy,
        "command": list(role.command),
        "env": container_env(role, w),
        "ports": [{"name": p, "containerPort": port, "protocol": "TCP"} for p, port in role.ports.items()],
        "volumeMounts": mounts,
        "securityContext": container_security(w),
        **probes,
    }
    resources = _resources(w)
    if resources:
        out["resources"] = resources
    return out


def pod_spec(w: WorkloadSpec, container_: dict[str, Any], volumes_: list[Volume], grace: int,
             scheduler: str | None, init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        **({"initContainers": init} if init else {}),
        "containers": [container_],
        "volumes": volumes_,
        "securityContext": pod_security(w),
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
