"""Why a job's pod cannot start or keeps failing, read from the pod itself: its PodScheduled
condition, its containers' states (init containers first) and its volumes, never from Events
(they expire, and the operator does not watch them).

What the fields say, as the Kubernetes docs give them
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions and
#container-state-waiting): a pod the scheduler cannot place has PodScheduled=False with reason
Unschedulable and the scheduler's message ("0/1 nodes are available: pod has unbound immediate
PersistentVolumeClaims"; the message names no claim, so the pod's own claims are named from its
volumes); a pod held by scheduling gates (a queue such as Kueue not admitting it yet) has reason
SchedulingGated; a container that will not start waits with the kubelet's reason (ErrImagePull and
ImagePullBackOff with the image, CreateContainerConfigError with the missing Secret or ConfigMap
key, CrashLoopBackOff after runs that ended, the last one in lastState.terminated with its
termination message).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from grpojob.api import GRPOJob

from .. import pods as pod_parts

UNSCHEDULABLE, GATED, CRASHLOOP, POD_FAILED = "Unschedulable", "SchedulingGated", "CrashLoopBackOff", "PodFailed"
IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError",)
START_REASONS = ("CreateContainerError", "RunContainerError", "PreStartHookError", "PostStartHookError")
# Reasons that are a warning: each is an Event when it first shows (ErrImagePull and ImagePullBackOff
# alternate while the kubelet backs off: one group, one Event).
WARNING_REASONS = frozenset({UNSCHEDULABLE, CRASHLOOP, POD_FAILED, *IMAGE_REASONS, *CONFIG_REASONS,
                             *START_REASONS})
TERMINATION_MESSAGE_CHARS = 400  # the end of a long termination message (a traceback's last lines)


def news_key(reason: str, message: str) -> tuple[str, ...]:
    """What makes a pod's problem news (an Event): its reason and words, not its numbers (pods
    ready, nodes, restarts change from look to look); ErrImagePull and ImagePullBackOff alternate
    while the kubelet backs off from one image: one problem."""
    return ("image",) if reason in IMAGE_REASONS else (reason, re.sub(r"\d+", "#", message))


@dataclass(frozen=True)
class PodProblem:
    """What keeps one pod from starting or running: the reason as Kubernetes gives it, and the
    scheduler's or kubelet's own words."""
    reason: str
    message: str = ""
    container: str = ""
    image: str = ""
    init: bool = False  # an init container's
    claims: tuple[tuple[str, str], ...] = ()  # the pod's (volume, claim name), for an unbound claim
    gates: tuple[str, ...] = ()  # spec.schedulingGates' names


def _claims(spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((v.get("name", ""), v["persistentVolumeClaim"]["claimName"]) for v in spec.get("volumes") or []
                 if (v.get("persistentVolumeClaim") or {}).get("claimName"))


def _last_run(cs: Mapping[str, Any]) -> str:
    term = (cs.get("lastState") or {}).get("terminated") or {}
    if not term:
        return "its last run left no exit status"
    text = f"exit code {term.get('exitCode')}" + (f" ({term['reason']})" if term.get("reason") else "")
    message = (term.get("message") or "").strip()
    if len(message) > TERMINATION_MESSAGE_CHARS:
        message = "..." + message[-TERMINATION_MESSAGE_CHARS:]
    return text + (f": {message}" if message else "")


def _container_problem(cs: Mapping[str, Any], init: bool, images: Mapping[str, str]) -> Optional[PodProblem]:
    waiting = (cs.get("state") or {}).get("waiting") or {}
    reason, name = waiting.get("reason") or "", cs.get("name", "")
    if reason == CRASHLOOP:
        # The waiting message holds the back-off time, which grows each restart; the last run is the news.
        return PodProblem(CRASHLOOP, _last_run(cs), name, init=init)
    if reason in IMAGE_REASONS:
        return PodProblem(reason, waiting.get("message") or "", name, cs.get("image") or images.get(name, ""),
                          init=init)
    if reason in CONFIG_REASONS or reason in START_REASONS:
        return PodProblem(reason, waiting.get("message") or "", name, init=init)
    return None


def pod_problem(spec: Mapping[str, Any], status: Mapping[str, Any]) -> Optional[PodProblem]:
    """The first thing that keeps the pod from running, None when nothing does (or nothing yet)."""
    if status.get("phase") == "Failed":  # evicted, or a node that refused it: the pod will not run again
        return PodProblem(POD_FAILED, f"{status.get('reason') or 'Failed'}: {status.get('message') or ''}".rstrip(": "))
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            if c.get("reason") == UNSCHEDULABLE:
                return PodProblem(UNSCHEDULABLE, c.get("message") or "", claims=_claims(spec))
            if c.get("reason") == GATED:
                return PodProblem(GATED, c.get("message") or "",
                                  gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or []))
    images = {c.get("name", ""): c.get("image", "") for c in [*(spec.get("initContainers") or []),
                                                               *(spec.get("containers") or [])]}
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for cs in status.get(key) or []:
            found = _container_problem(cs, init, images)
            if found is not None:
                return found
    return None


def _claim_role(job: GRPOJob, volume: str, claim: str) -> str:
    c = job.spec.checkpoint
    if volume == pod_parts.CHECKPOINTS_VOLUME and c.volume_claim != claim:
        how = (f"storageClassName {c.storage_class_name}: that StorageClass must exist and provision it"
               if c.storage_class_name else "no storageClassName: only the cluster's default StorageClass "
               "provisions it")
        return f"the trainer's checkpoint claim, from its volumeClaimTemplate with {how}"
    if volume == pod_parts.CHECKPOINTS_VOLUME:
        return "spec.checkpoint.volumeClaim: it must exist and be bound"
    if volume == pod_parts.MODELS_VOLUME:
        return "spec.model.volumeClaim: it must exist and be bound"
    return f"the pod's volume {volume}"


def _claims_text(job: GRPOJob, problem: PodProblem) -> str:
    if "PersistentVolumeClaim" not in problem.message or not problem.claims:
        return ""
    text = "; the pod's claims: " + ", ".join(f"{claim} ({_claim_role(job, volume, claim)})"
                                             for volume, claim in problem.claims)
    if any(v == pod_parts.CHECKPOINTS_VOLUME and job.spec.checkpoint.volume_claim != c for v, c in problem.claims):
        text += (". To bind the checkpoint claim: give the cluster a default StorageClass (or a PersistentVolume "
                 "it can bind), or create the job again with spec.checkpoint.storageClassName (an existing "
                 "StorageClass), spec.checkpoint.volumeClaim (an existing claim) or spec.checkpoint.storage: "
                 "ephemeral (these fields are fixed once the job exists)")
    return text


def describe(job: GRPOJob, pod: str, problem: PodProblem) -> str:
    """One sentence on what keeps `pod` waiting, with the spec fields that change it."""
    r, m = problem.reason, problem.message
    what = f"{'init container' if problem.init else 'container'} {problem.container}"
    if r == UNSCHEDULABLE:
        return f"{pod} cannot be scheduled: {m.rstrip('. ')}{_claims_text(job, problem)}"
    if r == GATED:
        gates = ", ".join(problem.gates) or "?"
        return f"{pod} waits to be admitted: its scheduling gates ({gates}) are still on (a queue such as Kueue removes them)"
    if r in IMAGE_REASONS:
        return f"{pod}: {what} cannot pull image {problem.image or '?'} ({r}" + (f": {m})" if m else ")")
    if r == CRASHLOOP:
        return f"{pod}: {what} keeps failing (CrashLoopBackOff), last run {m}"
    if r in CONFIG_REASONS:
        return f"{pod}: {what} cannot be configured ({r}): {m}"
    if r == POD_FAILED:
        return f"{pod} failed: {m}"
    return f"{pod}: {what} cannot start ({r})" + (f": {m}" if m else "")


def first_problem(pods: Iterable[Any]) -> Optional[Any]:
    """The first pod (of PodViews, in order) with a problem, not being deleted."""
    return next((p for p in pods if p.problem is not None and not p.deleting), None)
