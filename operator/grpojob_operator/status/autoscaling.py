"""spec.rollout.autoscale on a cluster: the rollout Deployment's replicas from the trainer's /status.

`step` runs the shared rule (grpojob.api.autoscale.decide) on the trainer leader's last report
(TrainerStatus.pipeline, read by the controller's status look), keeping the rule's state in
GRPOJob.status.autoscale, so an operator restart carries on where it left. The replicas it returns
are what the children render into the Deployment (`rollout_replicas`): the reconcile and the
autoscaler write one number, they cannot fight. A change is an Event (RolloutScaled) with the
signal and the reason. Once the job has ended, `ended` says so, with the last figures it read.
"""
from __future__ import annotations

from datetime import datetime
from typing import Optional

from grpojob.api import GRPOJob
from grpojob.api.autoscale import HOLD, KEPT, NO_GAIN, Signals, State, decide
from grpojob.api.status import AutoscaleStatus, TrainerStatus

from .conditions import Event, iso, parse_time

SCALED = "RolloutScaled"
FINISHED = "Finished"


def signals(trainer: Optional[TrainerStatus]) -> Optional[Signals]:
    """The autoscaler's input from the leader's /status; None before its first step's report."""
    p = trainer.pipeline if trainer is not None else None
    if p is None or not p.step_seconds:
        return None
    lags = [r.lag for r in trainer.rollouts if r.lag is not None]
    return Signals(step=p.step, wait_seconds=p.wait_seconds, step_seconds=p.step_seconds,
                   idle_fraction=p.rollout_idle_fraction, groups_in_flight=p.groups_in_flight,
                   policy_lag=float(max(lags)) if lags else None, servers=len(trainer.rollouts) or None)


def rollout_replicas(job: GRPOJob, st: Optional[AutoscaleStatus]) -> int:
    """The rollout servers to run while the job runs: the autoscaler's when it is on."""
    a = job.spec.rollout.autoscale
    if a is None:
        return job.spec.rollout.replicas
    wanted = st.replicas if st is not None else job.spec.rollout.replicas
    return min(a.max_replicas, max(a.min_replicas, wanted))


def step(job: GRPOJob, prev: Optional[AutoscaleStatus], trainer: Optional[TrainerStatus],
         now: datetime) -> tuple[Optional[AutoscaleStatus], list[Event]]:
    """The next status.autoscale and the Events of a change. Only a trainer that trains moves it;
    otherwise the bounds alone are applied (an edit of min/maxReplicas counts at once)."""
    spec = job.spec.rollout.autoscale
    if spec is None:
        return None, []
    state = _state(prev, job.spec.rollout.replicas)
    training = trainer is not None and trainer.phase in ("running", "checkpointing")
    s = signals(trainer) if training else None
    d = decide(spec, state, s, now.timestamp())
    new = d.state
    out = AutoscaleStatus(
        replicas=d.replicas, reason=d.reason, message=d.message,
        last_scale_time=iso(now) if d.changed else (prev.last_scale_time if prev else None),
        last_step=new.last_step, direction=new.direction, streak=new.streak, proposal=new.proposal,
        wait_fraction=s.wait_fraction if s else (prev.wait_fraction if prev else None),
        idle_fraction=s.idle_fraction if s else (prev.idle_fraction if prev else None),
        step_seconds=new.seconds, measured=new.measured, trial_from=new.trial_from, before_seconds=new.before,
        backoff_seconds=new.backoff)
    if d.reason == "NoSignal" and new.last_step >= 0:  # not "has not reported yet": it has, and paused
        said = f"says {trainer.phase}" if trainer is not None else "does not answer"
        out.message = f"no step reported now (the trainer {said}); the last counted was step {new.last_step}"
    # a scale-up undone is a Warning of its own reason: the job's servers slow each other down
    events = ([Event("Warning", NO_GAIN, d.message)] if d.reason == NO_GAIN else
              [Event("Normal", SCALED, f"{d.reason}: {d.message}")] if d.changed else [])
    if d.kept:  # the servers of a scale-up stay: why, once
        events.insert(0, Event("Normal", KEPT, d.kept))
    return out, events


def ended(st: Optional[AutoscaleStatus], phase: str) -> Optional[AutoscaleStatus]:
    """status.autoscale of a job that has Succeeded or Failed: reason Finished, the last figures kept
    (a NoSignal beside lastStep and waitFraction would read as a job still starting)."""
    if st is None or st.reason == FINISHED:
        return st
    figures = [f"{st.replicas} rollout servers"]
    if st.last_step >= 0:
        figures.append(f"last counted step {st.last_step}")
    if st.wait_fraction is not None:
        figures.append(f"trainer waited {st.wait_fraction:.0%} of it for groups")
    if st.idle_fraction is not None:
        figures.append(f"servers idle {st.idle_fraction:.0%}")
    return st.model_copy(update={"reason": FINISHED, "direction": HOLD, "streak": 0, "proposal": 0,
                                 "message": f"the job {phase}; autoscaling ended at " + ", ".join(figures)})


def _state(prev: Optional[AutoscaleStatus], initial: int) -> State:
    if prev is None:
        return State(replicas=initial)
    last = parse_time(prev.last_scale_time)
    return State(replicas=prev.replicas, last_step=prev.last_step, direction=prev.direction or HOLD,
                 streak=prev.streak, proposal=prev.proposal, last_change=last.timestamp() if last else None,
                 seconds=prev.step_seconds or 0.0, measured=prev.measured or 0, trial_from=prev.trial_from or 0,
                 before=prev.before_seconds or 0.0, backoff=prev.backoff_seconds or 0.0)

