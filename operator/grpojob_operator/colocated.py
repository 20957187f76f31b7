"""spec.placement colocated in the trainer pod: the engine as a second container, or, with GPUs, as a
second process of the trainer's one container (grpojob.colocated_pod; docs/colocated.md)."""
from __future__ import annotations

import copy
from typing import Any

from grpojob import plan
from grpojob.api import FieldError, GRPOJob, colocation
from grpojob.api.colocation import COLOCATED

from . import pods


def one_container(job: GRPOJob) -> bool:
    """Colocated with GPUs: the trainer and its engine share one container (grpojob.colocated_pod),
    as a device plugin gives each GPU to one container only."""
    return job.spec.placement == COLOCATED and bool(colocation.gpus(job.spec.trainer.resources))


def one_container_errors(job: GRPOJob) -> list[FieldError]:
    """What spec.rollout cannot say about a container it does not have (colocated with GPUs)."""
    r, why = job.spec.rollout, ("placement colocated with GPUs runs the engine in the trainer's container "
                                "(a device plugin gives a GPU to one container only)")
    errors = []
    if r.image and r.image != job.spec.trainer.image:
        errors.append(FieldError("spec.rollout.image", f"{why}: it runs spec.trainer.image; set that one "
                                 "(an image with the trainer and the engine, like the runtime image)"))
    if r.resources:
        errors.append(FieldError("spec.rollout.resources", f"{why}: put what the engine needs into "
                                 "spec.trainer.resources"))
    if r.security_context:
        errors.append(FieldError("spec.rollout.securityContext", f"{why}: it has spec.trainer.securityContext"))
    for i, var in enumerate(r.env):
        if "value" not in var and "valueFrom" in var:
            errors.append(FieldError(f"spec.rollout.env[{i}].valueFrom", f"{why}: only plain values reach the "
                                     "engine alone; put this one into spec.trainer.env (both processes see it)"))
    return errors


def container_role(job: GRPOJob, trainer: plan.Role, engine: plan.Role) -> plan.Role:
    """The one container's role (plan.one_container); the engine alone gets the plain values of
    spec.rollout.env (one_container_errors refuses the others)."""
    return plan.one_container(trainer, engine, {v["name"]: v["value"] for v in job.spec.rollout.env if "value" in v})


def engine_container(job: GRPOJob, role: plan.Role, image: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """spec.placement colocated: the rollout server as a second container of the trainer pod. It mounts
    what the trainer mounts (the same emptyDirs: /dev/shm in memory, which the weight push goes
    through, /tmp, $HOME), takes the image, environment, resources and security context of
    spec.rollout, and listens on loopback only (the plan): the kubelet cannot probe it, so the
    trainer's pod reports it through the trainer (an engine that exits is restarted by the kubelet
    and caught up by the weight-sync store)."""
    w = job.spec.rollout
    container = pods.container("rollout", role, w, image, copy.deepcopy(mounts), {})
    container["ports"] = []  # loopback only: nothing outside the pod reaches it
    return container
