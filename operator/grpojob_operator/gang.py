"""Gang scheduling: what Kueue or Volcano reads on a job's workloads and pods.

Kueue counts a pod group by the pods that carry its name label, and every member must carry the
same total-count annotation, fixed for the group's life (its own StatefulSet integration only
scales to and from zero). A count that includes the rollouts would sit in the trainer's pod
template, and scaling the rollouts would then roll the trainer StatefulSet. So, as Kueue itself
shapes a StatefulSet and a Deployment: the trainer StatefulSet is one pod group of
`trainer.replicas` pods (every torchrun node starts together), and each rollout pod of the
Deployment is admitted on its own, free to scale. Volcano keeps its count in the PodGroup object
(children.volcano_podgroup), patched in place; its pods carry only the group's name.
"""
from __future__ import annotations

from typing import Optional

from grpojob.api import GRPOJob

from . import names as n

KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
# The group's pods are replaced by their StatefulSet, never "finished" by an exit.
KUEUE_SERVING = "kueue.x-k8s.io/pod-group-serving"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"


def workload_labels(job: GRPOJob) -> dict[str, str]:
    """Labels of the StatefulSet and the Deployment themselves (Kueue's workload integrations)."""
    s = job.spec.scheduling
    return {KUEUE_QUEUE: s.queue_name} if s.gang == "kueue" and s.queue_name else {}


def pod_metadata(job: GRPOJob, role: str) -> tuple[dict[str, str], dict[str, str]]:
    """Pod-template labels and annotations of `role`; none of them depends on the rollout count."""
    s = job.spec.scheduling
    labels, annotations = dict(workload_labels(job)), {}
    if s.gang == "kueue" and role == "trainer":
        labels[KUEUE_GROUP] = n.trainer_name(job.metadata.name)
        annotations[KUEUE_TOTAL] = str(job.spec.trainer.replicas)
        annotations[KUEUE_SERVING] = "true"
    elif s.gang == "volcano":
        annotations[VOLCANO_GROUP] = job.metadata.name
    return labels, annotations


def scheduler(job: GRPOJob) -> Optional[str]:
    s = job.spec.scheduling
    return s.scheduler_name or ("volcano" if s.gang == "volcano" else None)
