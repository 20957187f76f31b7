"""The trainer leader's report: progress, and the conditions that read it (TrainerReachable,
WeightsInSync)."""
from __future__ import annotations

from typing import Optional

from grpojob.api import GRPOJob, TrainerStatus
from grpojob.api.status import Progress

from .conditions import Conditions
from .observe import Observation, leader_ready


def progress(prev: Progress, t: Optional[TrainerStatus], job: GRPOJob) -> Progress:
    """The trainer's numbers when it answered, else the last ones; the step count from the spec.

    Progress never goes back: a trainer that restarted reports step 0 until it has loaded its
    checkpoint, then the checkpoint's step, which may be older than the last step it reported.
    Such a report is held back until the trainer has caught up."""
    total = (t.total_steps if t is not None else 0) or prev.total_steps or job.spec.training.steps
    if t is None or t.step < prev.step:
        return prev.model_copy(update={"total_steps": total})
    return Progress(step=t.step, total_steps=total, policy_version=t.policy_version, reward_mean=t.reward_mean,
                    kl=t.kl, tokens_per_second=t.tokens_per_second, last_checkpoint_step=t.last_checkpoint_step,
                    weights_in_sync=t.weights_in_sync, rollouts=[r.model_copy() for r in t.rollouts],
                    weight_sync_backend=t.weight_sync_backend, placement=t.placement,
                    # a restarted trainer has not evaluated yet: the last evaluation stays
                    evaluation=t.evaluation.model_copy() if t.evaluation is not None else prev.evaluation)


def trainer_conditions(conds: Conditions, obs: Observation) -> None:
    """TrainerReachable: True when /status answered, False (with the error) when the leader pod is
    ready but /status does not answer (a NetworkPolicy, DNS, a crashed server), Unknown while the
    trainer starts or is not running. WeightsInSync: the trainer's own word, Unknown without it."""
    t = obs.trainer
    if t is not None:
        conds.set("TrainerReachable", True, "Reachable", "the trainer leader's /status answers")
    elif obs.trainer_error and leader_ready(obs.trainer_pods):
        conds.set("TrainerReachable", False, "Unreachable", obs.trainer_error)
    elif obs.trainer_error:
        conds.set("TrainerReachable", "Unknown", "Starting", f"the trainer is starting: {obs.trainer_error}")
    else:
        conds.set("TrainerReachable", "Unknown", "NotRunning", "trainer pod 0 is not running")
    if t is not None and t.weights_in_sync is not None:
        conds.set("WeightsInSync", t.weights_in_sync, "Synced" if t.weights_in_sync else "Behind",
                  f"policy version {t.policy_version}" + (f" ({t.weight_sync_backend})" if t.weight_sync_backend else ""))
    elif t is None:
        reason, message = (("NoReport", "the trainer's /status was not read") if obs.polled
                           else ("NotRunning", "no trainer is running"))
        if not conds.is_("WeightsInSync", "Unknown", reason):
            conds.set("WeightsInSync", "Unknown", reason, message)
