"""Pods ready against pods wanted: TrainerReady, RolloutReady and the replica counts."""
from __future__ import annotations

from grpojob.api import GRPOJobStatus
from grpojob.api.status import ReplicaStatus

from ..children import Scale
from .conditions import Conditions
from .observe import Observation, ready_count


def readiness(conds: Conditions, st: GRPOJobStatus, obs: Observation, scale: Scale) -> None:
    trainer, rollout = ready_count(obs.trainer_pods), ready_count(obs.rollout_pods)
    st.trainer = ReplicaStatus(desired=scale.trainer, ready=trainer)
    st.rollout = ReplicaStatus(desired=scale.rollout, ready=rollout)
    _condition(conds, "TrainerReady", "trainer", trainer, scale.trainer)
    _condition(conds, "RolloutReady", "rollout", rollout, scale.rollout)


def _condition(conds: Conditions, type_: str, role: str, ready: int, desired: int) -> None:
    if desired == 0:
        conds.set(type_, False, "ScaledDown", f"no {role} pods wanted")
    elif ready >= desired:
        conds.set(type_, True, "AllReady", f"{ready}/{desired} {role} pods ready")
    else:
        conds.set(type_, False, "Waiting", f"{ready}/{desired} {role} pods ready")
