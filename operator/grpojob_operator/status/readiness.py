"""Pods ready against pods wanted: TrainerReady, RolloutReady (JudgeReady with spec.judges) and the
replica counts.

The counts are the pods seen, whatever is wanted: after a scale-down to zero they fall as the pods
go, and reach 0 when none is left. A role short of ready pods says why when one of its pods cannot
start or keeps failing (waiting.py): the condition's reason is the pod's (Unschedulable,
ImagePullBackOff, CrashLoopBackOff...), its message names the pod and what to change.
"""
from __future__ import annotations

from typing import Optional, Sequence

from grpojob.api import GRPOJob, GRPOJobStatus
from grpojob.api.status import ReplicaStatus

from ..children import Scale
from .conditions import Conditions
from .observe import Observation, PodView, ready_count
from .waiting import describe, first_problem


def readiness(conds: Conditions, st: GRPOJobStatus, obs: Observation, scale: Scale, job: GRPOJob) -> None:
    trainer, rollout = ready_count(obs.trainer_pods), ready_count(obs.rollout_pods)
    st.trainer = ReplicaStatus(desired=scale.trainer, ready=trainer)
    st.rollout = ReplicaStatus(desired=scale.rollout, ready=rollout)
    _condition(conds, "TrainerReady", "trainer", trainer, scale.trainer, obs.trainer_pods, job)
    _condition(conds, "RolloutReady", "rollout", rollout, scale.rollout, obs.rollout_pods, job)
    if job.spec.judges:  # JudgeReady: every judge pod serves its loaded model
        wanted = sum(j.replicas for j in job.spec.judges) if scale.trainer else 0
        _condition(conds, "JudgeReady", "judge", ready_count(obs.judge_pods), wanted, obs.judge_pods, job)
    else:  # none declared, or the last one taken out of the suspended job
        conds.drop("JudgeReady")


def blocked(job: GRPOJob, obs: Observation) -> Optional[str]:
    """What keeps the first stuck pod of the job (trainer, rollout, then environment pods) from
    running, in words; None when no pod is stuck."""
    pod = first_problem([*obs.trainer_pods, *obs.rollout_pods, *obs.judge_pods, *obs.environment_pods])
    return describe(job, pod.name, pod.problem) if pod is not None else None


def _condition(conds: Conditions, type_: str, role: str, ready: int, desired: int, pods: Sequence[PodView],
               job: GRPOJob) -> None:
    if desired == 0:
        conds.set(type_, False, "ScaledDown", f"no {role} pods wanted" + (f", {ready} still ready" if ready else ""))
    elif ready >= desired:
        conds.set(type_, True, "AllReady", f"{ready}/{desired} {role} pods ready")
    elif (stuck := first_problem(pods)) is not None:
        conds.set(type_, False, stuck.problem.reason,
                  f"{ready}/{desired} {role} pods ready: {describe(job, stuck.name, stuck.problem)}")
    else:
        conds.set(type_, False, "Waiting", f"{ready}/{desired} {role} pods ready")
