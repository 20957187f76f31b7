"""Suspending a job: ask the trainer to checkpoint and stop, and scale to zero only once it has,
once no trainer runs, or once the wait for it is over (the reason says which).

A running trainer is never scaled away without being asked: while its /status or /suspend does not
answer, the request is repeated every look until `suspend_timeout`, and the Suspended condition
carries the last error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpojob.api import GRPOJob, GRPOJobStatus
from grpojob.api.operations import EPHEMERAL

from .conditions import Conditions, parse_time
from .observe import Observation, leader_exited_cleanly, leader_up

CHECKPOINTING = "Checkpointing"
ASKED = "asked the trainer to checkpoint and stop"
REFUSED = "SuspendRefused"


@dataclass(frozen=True)
class SuspendStep:
    done: bool  # scale to zero now
    request: bool = False  # POST /suspend to the trainer (again)


def suspend(conds: Conditions, st: GRPOJobStatus, obs: Observation, ledger_before: dict[str, int],
            timeout: float) -> SuspendStep:
    if conds.is_("Suspended"):
        return SuspendStep(done=True)
    t = obs.trainer
    step = st.progress.last_checkpoint_step if st.progress.last_checkpoint_step is not None else st.progress.step
    if conds.is_("Suspended", "Unknown", CHECKPOINTING):
        asking = conds.get("Suspended")
        since = parse_time(asking.last_transition_time) or obs.now
        if (t is not None and t.phase == "suspended") or leader_exited_cleanly(ledger_before, obs.trainer_pods):
            conds.set("Suspended", True, "Checkpointed", f"trainer checkpointed at step {step}")
            return SuspendStep(done=True)
        if not any(p.phase == "Running" and not p.deleting for p in obs.trainer_pods):
            conds.set("Suspended", True, "TrainerStopped", "the trainer stopped before confirming a checkpoint "
                      f"(newest checkpoint: step {step})")
            return SuspendStep(done=True)
        if (obs.now - since).total_seconds() > timeout:
            why = "" if asking.message == ASKED else f" ({asking.message})"
            conds.set("Suspended", True, "CheckpointTimeout", f"no checkpoint confirmed within {timeout:.0f}s{why}; "
                      "scaled down (SIGTERM asks the trainer to checkpoint too)")
            return SuspendStep(done=True)
        if t is None and obs.trainer_error:
            _asking(conds, f"the trainer's /status does not answer: {obs.trainer_error}; asking again")
        # Ask again while it is not checkpointing: the first ask may have been lost.
        return SuspendStep(done=False, request=t is None or t.phase in ("starting", "running"))
    if leader_up(obs.trainer_pods):
        conds.set("Suspended", "Unknown", CHECKPOINTING, ASKED)
        return SuspendStep(done=False, request=t is None or t.phase != "checkpointing")
    conds.set("Suspended", True, "Suspended", "no trainer was running: nothing to checkpoint")
    return SuspendStep(done=True)


def refuse_ephemeral(conds: Conditions, st: GRPOJobStatus, obs: Observation, job: GRPOJob) -> bool:
    """A job whose checkpoints live in an emptyDir (spec.checkpoint.storage: ephemeral) would lose
    them with its pods (an emptyDir is deleted with its pod): its suspend is refused, with the
    reason, once a trainer has run (before, there is nothing to lose; a queue such as Kueue creates
    jobs suspended). Checkpoints in an object store are in no emptyDir. True when refused."""
    if job.spec.checkpoint.storage != EPHEMERAL or job.spec.checkpoint.in_store or conds.is_("Suspended") or \
            conds.is_("Suspended", "Unknown", CHECKPOINTING):
        return False
    if st.start_time is None and not leader_up(obs.trainer_pods):
        return False
    conds.set("Suspended", False, REFUSED, "suspend refused: spec.checkpoint.storage is ephemeral, an emptyDir "
              "deleted with the trainer pod when suspend scales it to zero, so the job would resume from step 0; "
              "set spec.runPolicy.suspend back to false (to suspend, create the job with checkpoint.storage "
              "persistent or checkpoint.volumeClaim)")
    return True


def _asking(conds: Conditions, message: str) -> None:
    conds.set("Suspended", "Unknown", CHECKPOINTING, message)


def request_failed(conds: Conditions, error: Optional[str]) -> None:
    """Record why POST /suspend failed; the next look asks again."""
    if error:
        _asking(conds, f"could not ask the trainer to checkpoint: {error}; asking again")
