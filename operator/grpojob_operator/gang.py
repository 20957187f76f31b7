"""Gang scheduling: one group holds the whole job, so trainer and rollout pods are admitted together
(a trainer admitted without its rollout servers waits for samples that never come, holding its GPUs).

Kueue, plain Pod groups (https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/, "Running a group of
Pods to be admitted together"): every member carries the label `kueue.x-k8s.io/pod-group-name` and
the annotation `kueue.x-k8s.io/pod-group-total-count`, consistently, and the queue label
`kueue.x-k8s.io/queue-name` ("Queue selection"). Here the group is named after the job (Kueue names
the group's Workload so, and makes every pod of the group its owner: kubernetes-sigs/kueue
pkg/controller/jobs/pod/pod_controller.go), and counts trainer.replicas + rollout.replicas (with
placement colocated the engine is in the trainer pods: trainer.replicas). Two more annotations from
Kueue's source (pkg/controller/jobs/pod/pod_webhook.go), as its own StatefulSet integration sets
them: `kueue.x-k8s.io/pod-group-serving: "true"` (our pods are replaced by their controllers, never
finished by an exit) and `kueue.x-k8s.io/role-hash` (getRoleHash takes a role set on the pod as it is):
one role per workload, trainer and rollout, instead of one per StatefulSet pod (its per-pod labels
and claims would each make a role; Kueue refuses a group of more than 8).

What the cluster needs: Kueue's `pod` integration on for the job's namespace, and its
`statefulset` and `deployment` integrations off: Kueue's pod webhook leaves alone every pod whose
owner's kind has an integration enabled (pod_webhook.go, Default). The StatefulSet and Deployment
carry no queue label for the same reason: with one, those integrations would each make a group of
their own pods. The count is in both pod templates, so a new rollout count is a new gang: a running
job refuses it (changes.py); suspend, edit, resume.

Volcano (https://volcano.sh/en/docs/podgroup/): a PodGroup (children.volcano_podgroup) whose
minMember counts trainer and rollout pods, and the annotation `scheduling.k8s.io/group-name` naming
it on every pod template (KubeGroupNameAnnotationKey, volcano-sh/apis
pkg/apis/scheduling/v1beta1/labels.go), with schedulerName volcano. The count lives in the PodGroup,
patched in place: scaling the rollouts touches no pod template.
"""
from __future__ import annotations

from typing import Optional

from grpojob.api import GRPOJob
from grpojob.api.colocation import COLOCATED

from . import names as n

KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_SERVING = "kueue.x-k8s.io/pod-group-serving"
KUEUE_ROLE = "kueue.x-k8s.io/role-hash"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"


def group_name(job: GRPOJob) -> str:
    """The job's pod group (Kueue) or PodGroup (Volcano)."""
    return job.metadata.name


def members(job: GRPOJob) -> int:
    """Pods of the gang: every trainer pod and every rollout pod (none of its own when colocated);
    with spec.rollout.autoscale, the rollout pods it never goes below (minReplicas)."""
    spec = job.spec
    rollouts = spec.rollout.autoscale.min_replicas if spec.rollout.autoscale else spec.rollout.replicas
    judges = sum(j.replicas for j in spec.judges)  # spec.judges: the trainer cannot score without them
    return spec.trainer.replicas + (0 if spec.placement == COLOCATED else rollouts) + judges


def pod_metadata(job: GRPOJob, role: str) -> tuple[dict[str, str], dict[str, str]]:
    """Pod-template labels and annotations of `role` (trainer, rollout, environment). Environment
    pods are no members: with Kueue each is admitted on its own, with Volcano they join the group
    beyond its minMember."""
    s = job.spec.scheduling
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if s.gang == "kueue":
        if s.queue_name:
            labels[KUEUE_QUEUE] = s.queue_name
        if role in (*n.ROLES, "judge"):
            labels[KUEUE_GROUP] = group_name(job)
            annotations[KUEUE_TOTAL] = str(members(job))
            annotations[KUEUE_SERVING] = "true"
            annotations[KUEUE_ROLE] = role
    elif s.gang == "volcano":
        annotations[VOLCANO_GROUP] = group_name(job)
    return labels, annotations


def scheduler(job: GRPOJob) -> Optional[str]:
    s = job.spec.scheduling
    return s.scheduler_name or ("volcano" if s.gang == "volcano" else None)
