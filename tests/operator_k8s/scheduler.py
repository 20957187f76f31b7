"""The scheduler and the kubelet where a pod cannot start, acted out (kmock has neither, nor a
volume controller); each change goes through the emulator's HTTP API, as the real components'
status updates do.

- A PersistentVolumeClaim that names no storageClassName gets the cluster's default StorageClass;
  with none, nothing provisions it and it stays Pending until a matching PersistentVolume appears
  (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#class-1,
  https://kubernetes.io/docs/concepts/storage/dynamic-provisioning/#defaulting-behavior).
- The scheduler's VolumeBinding plugin refuses a pod with an unbound claim of Immediate binding
  mode: PodScheduled=False, reason Unschedulable, "0/N nodes are available: pod has unbound
  immediate PersistentVolumeClaims." (kubernetes/kubernetes
  pkg/scheduler/framework/plugins/volumebinding/volume_binding.go; a v1.36.2 cluster said exactly
  this, /work/shared/NOTES.md). The message names no claim.
- A container the kubelet cannot start waits with a reason and message
  (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting).
"""
from __future__ import annotations

from typing import Any, Optional

from .cluster import Cluster, pod_path
from .kmock_shim import PVCS

UNBOUND = ("0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are "
           "available: 1 Preemption is not helpful for scheduling.")


def unbound_claims(cluster: Cluster, pod: dict[str, Any]) -> list[str]:
    """The pod's claims that are not Bound: with no StorageClass in the cluster, every claim that
    names none (nothing sets a claim Bound here unless a test does)."""
    ns = pod["metadata"]["namespace"]
    out = []
    for v in pod["spec"].get("volumes") or []:
        name = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if name:
            claim = cluster.emu.get_obj(PVCS, ns, name)
            if claim is None or (claim.get("status") or {}).get("phase") != "Bound":
                out.append(name)
    return out


async def schedule_without_storage_class(cluster: Cluster, ns: str, job: str) -> list[str]:
    """One pass of the scheduler over the job's pods: a pod with an unbound claim is Unschedulable.
    Returns the pods it refused."""
    refused = []
    for pod in cluster.pods(ns, job):
        if unbound_claims(cluster, pod):
            name = pod["metadata"]["name"]
            await cluster.patch(pod_path(ns, name) + "/status", {"status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNBOUND}]}})
            refused.append(name)
    return refused


async def container_waits(cluster: Cluster, ns: str, pod: str, container: str, reason: str, message: str = "",
                          image: str = "", last: Optional[dict[str, Any]] = None, restarts: int = 0) -> None:
    """Kubelet: the pod's container waits with `reason` (and its last run ended as `last`)."""
    cs: dict[str, Any] = {"name": container, "image": image, "ready": False, "restartCount": restarts,
                          "state": {"waiting": {"reason": reason, **({"message": message} if message else {})}}}
    if last:
        cs["lastState"] = {"terminated": last}
    await cluster.patch(pod_path(ns, pod) + "/status", {"status": {
        "phase": "Running" if last else "Pending", "containerStatuses": [cs],
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}})
