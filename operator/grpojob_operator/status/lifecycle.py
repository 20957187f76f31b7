"""The phase of a job and what to do next: one pure function of (job, previous status, observation).

The controller gathers the observation (pods from kopf's index, the trainer leader's /status),
calls `decide`, does what the decision asks (children, /suspend, deletion), then records the
outcome of its actions with `with_children` and `with_suspend_request`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional, Sequence

from grpojob.api import FieldError, GRPOJob, GRPOJobStatus
from grpojob.api.validate import warnings as spec_warnings

from ..children import Scale
from . import autoscaling
from . import suspend as suspension
from .conditions import Conditions, Event, iso, parse_time
from .observe import (Observation, count_restarts, engine_failures, last_failure, leader_completed,
                      leader_exited_cleanly, plugin_failure, ready_count, running_count)
from .progress import progress, trainer_conditions
from .readiness import blocked, readiness

TERMINAL = ("Succeeded", "Failed")


@dataclass
class Decision:
    status: GRPOJobStatus
    scale: Scale
    ensure_children: bool  # create or repair the children (not for an invalid spec)
    ledger: dict[str, int]
    request_suspend: bool = False  # POST /suspend to the trainer leader
    delete_job: bool = False  # ttlSecondsAfterFinished has passed
    # Events that are no condition's transition: a rollout engine that failed, a spec's warnings.
    events: list[Event] = field(default_factory=list)


def decide(job: Optional[GRPOJob], prev: GRPOJobStatus, obs: Observation, *,
           generation: Optional[int] = None, errors: Sequence[FieldError] = (),
           rejected: Sequence[str] = (), rejected_reason: str = "ImmutableFieldChanged",
           suspend_timeout: float = 600.0) -> Decision:
    """The next status and actions of one job.

    errors: the spec is invalid (no children, phase Failed until fixed); rejected: why an edit of
    a running job was refused (it keeps running on its applied spec), with rejected_reason."""
    now = obs.now
    st = prev.model_copy(deep=True)
    st.observed_generation = generation
    conds = Conditions(st, now, generation)
    if errors or job is None:
        return _invalid(conds, st, job, errors, obs)
    _spec_conditions(conds, st, rejected, rejected_reason)
    st.progress = progress(st.progress, obs.trainer, job)
    trainer_conditions(conds, obs)
    ledger_before = dict(obs.ledger)
    delta, ledger = count_restarts(ledger_before, obs.trainer_pods)
    broken, seen = engine_failures(ledger_before, obs.rollout_pods)  # the kubelet restarts them: no failure
    ledger.update(seen)
    events = [Event("Warning", "EngineFailed", message) for message in broken]
    if generation is not None and prev.observed_generation != generation:  # once per spec generation
        events += [Event("Warning", "SpecWarning", str(w)) for w in spec_warnings(job)]

    running_reason = ""  # why the job is not Running, when _phase says

    def finish(scale: Scale, **kw) -> Decision:
        if st.phase in TERMINAL:
            st.autoscale = autoscaling.ended(st.autoscale, st.phase)
        readiness(conds, st, obs, scale, job)
        conds.set("Running", st.phase == "Running", running_reason or st.phase)
        conds.write()
        return Decision(st, scale, ensure_children=True, ledger=ledger, events=events, **kw)

    # Finished jobs: keep the outcome, clean up, and go away after the TTL.
    if st.phase in TERMINAL:
        return finish(_cleanup_scale(job, st), delete_job=_ttl_passed(job, st, now))

    spec = job.spec
    # spec.rollout.autoscale: the rollout servers' number while the job runs (the trainer's signals).
    st.autoscale, scaled = autoscaling.step(job, prev.autoscale, obs.trainer, now)
    events += scaled
    running = Scale(spec.trainer.replicas, autoscaling.rollout_replicas(job, st.autoscale))
    # A suspend that would lose the checkpoints (checkpoint.storage: ephemeral) is refused.
    suspend = spec.run_policy.suspend and not suspension.refuse_ephemeral(conds, st, obs, job)
    suspending = suspend or conds.is_("Suspended") or conds.is_("Suspended", "Unknown", suspension.CHECKPOINTING)
    completed = not suspending and _completed(job, st, obs, ledger_before)
    # Trainer failures count against backoffLimit, except exits asked for by a suspend.
    if not (suspending or completed):
        st.restarts += delta

    if suspend:
        step = suspension.suspend(conds, st, obs, ledger_before, suspend_timeout)
        if step.done:
            st.phase, st.message = "Suspended", "suspended: resume with spec.runPolicy.suspend=false"
            return finish(Scale(0, 0))
        st.message = "checkpointing before suspend"
        return finish(running, request_suspend=step.request)

    if conds.is_("Suspended") or conds.is_("Suspended", "Unknown", suspension.CHECKPOINTING):
        conds.set("Suspended", False, "Resumed", "resuming from the newest checkpoint")
        st.start_time = None  # like a Kubernetes Job, the active deadline restarts on resume
        st.phase = "Pending"
    elif conds.get("Suspended").reason == "Pending" or (
            conds.is_("Suspended", "False", suspension.REFUSED) and not spec.run_policy.suspend):
        conds.set("Suspended", False, "NotSuspended")

    scale = running
    if st.start_time is None and any(p.phase == "Running" for p in obs.trainer_pods):
        st.start_time = iso(now)
    start = parse_time(st.start_time)
    deadline = spec.run_policy.active_deadline_seconds
    failed_plugin = plugin_failure(obs)
    if failed_plugin:  # the same on every restart: fail now, with the runtime's own words
        _fail(conds, st, now, *failed_plugin)
        return finish(_cleanup_scale(job, st))
    if st.restarts > spec.run_policy.backoff_limit:
        why = last_failure(obs)
        _fail(conds, st, now, "BackoffLimitExceeded", f"trainer failed {st.restarts} times "
              f"(backoffLimit {spec.run_policy.backoff_limit})" + (f": {why}" if why else ""))
        return finish(_cleanup_scale(job, st))
    if deadline and start and (now - start).total_seconds() > deadline:
        _fail(conds, st, now, "DeadlineExceeded", f"ran longer than activeDeadlineSeconds ({deadline}s)")
        return finish(_cleanup_scale(job, st))
    if completed:
        st.phase, st.completion_time = "Succeeded", iso(now)
        st.progress.step = max(st.progress.step, spec.training.steps)  # the word may come before a report of it
        st.message = f"trained {st.progress.step}/{st.progress.total_steps} steps"
        conds.set("Succeeded", True, "Completed", st.message)
        return finish(_cleanup_scale(job, st))
    running_reason = _phase(conds, st, obs, scale, job, was_running=prev.phase == "Running",
                            last_step=prev.progress.step)
    return finish(scale)


def _completed(job: GRPOJob, st: GRPOJobStatus, obs: Observation, ledger_before: dict[str, int]) -> bool:
    """The trainer's own word that it reached training.steps, from any of: its /status says
    completed at the last step (a finished trainer stays up saying so until scaled down); pod 0's
    termination message says so (however the container ended since: a look between polls sees
    only what the kubelet kept); pod 0 exited 0 after its last report said it was at the last
    step. A clean exit short of the last step (a restart, a crash that exits 0) is not success. A
    job in mode service has no last step: it serves until suspended or deleted."""
    if job.spec.mode == "service":
        return False
    steps = job.spec.training.steps
    t = obs.trainer
    if t is not None and t.phase == "completed" and t.step >= steps:
        return True
    if leader_completed(obs.trainer_pods, steps):
        return True
    return leader_exited_cleanly(ledger_before, obs.trainer_pods) and st.progress.step >= steps


def _phase(conds: Conditions, st: GRPOJobStatus, obs: Observation, scale: Scale, job: GRPOJob, *,
           was_running: bool, last_step: int) -> str:
    """Running only while the trainer answers and trains: its /status says running (or
    checkpointing), every trainer pod runs, and it has stepped (a step since the last look, a
    rollout server ready to feed it, or it was Running already). Pods' readiness is not waited
    for: a readiness probe lags the process by up to its period. Anything else is Initializing,
    with why (the trainer does not answer, starts, waits for samples, or a pod cannot start).
    Returns the Running condition's reason."""
    trainer_ready, rollout = ready_count(obs.trainer_pods), ready_count(obs.rollout_pods)
    counts = f"trainer {trainer_ready}/{scale.trainer}, rollout {rollout}/{scale.rollout} ready"
    stuck = blocked(job, obs)
    t = obs.trainer
    training = t is not None and t.phase in ("running", "checkpointing")
    all_up = running_count(obs.trainer_pods) >= scale.trainer
    if training and all_up and (was_running or rollout >= 1 or t.step > last_step):
        st.phase = "Running"
        # the trainer's own word while it trains: what a step waits for ("step 13 waits for its
        # groups: rollout servers failing: ..."), so a stalled job says why in kubectl get grpo
        said = t.message if t.message and t.message != "training completed" else ""
        st.message = f"step {st.progress.step}/{st.progress.total_steps}" + "".join(
            f"; {x}" for x in (said, stuck) if x)
        return "Running"
    if not conds.is_("Created"):
        st.phase, st.message = "Pending", "creating child objects"
        return "Pending"
    st.phase = "Initializing"
    if conds.is_("TrainerReachable", "False"):
        reason, st.message = "TrainerUnreachable", f"the trainer does not answer: {conds.get('TrainerReachable').message}"
    elif training and all_up:
        reason, st.message = "WaitingForSamples", f"the trainer waits for its first samples: {counts}"
    elif t is not None and not training:
        reason, st.message = "TrainerNotRunning", f"the trainer says {t.phase}" + \
            (f" ({t.message})" if t.message else "") + f": {counts}"
    else:
        reason, st.message = "WaitingForPods", f"waiting for pods: {counts}"
    if stuck:
        st.message += f"; {stuck}"
    return reason


def _invalid(conds: Conditions, st: GRPOJobStatus, job: Optional[GRPOJob], errors: Sequence[FieldError],
             obs: Observation) -> Decision:
    msg = "; ".join(str(e) for e in errors) or "invalid spec"
    conds.set("InvalidSpec", True, "InvalidSpec", msg)
    conds.set("Failed", True, "InvalidSpec", msg)
    conds.set("Running", False, "InvalidSpec")
    st.phase, st.message = "Failed", f"invalid spec: {msg}"
    st.completion_time = st.completion_time or iso(obs.now)
    conds.write()
    return Decision(st, Scale(0, 0), ensure_children=False, ledger=dict(obs.ledger),
                    delete_job=_ttl_passed(job, st, obs.now))


def _spec_conditions(conds: Conditions, st: GRPOJobStatus, rejected: Sequence[str], reason: str) -> None:
    if conds.is_("InvalidSpec", reason="InvalidSpec"):  # the spec was fixed: start over
        conds.set("Failed", False, "SpecFixed")
        st.phase, st.completion_time = "Pending", None
    if rejected:
        conds.set("InvalidSpec", True, reason, "; ".join(rejected))
    else:
        conds.set("InvalidSpec", False, "Valid")


def _fail(conds: Conditions, st: GRPOJobStatus, now: datetime, reason: str, message: str) -> None:
    st.phase, st.message, st.completion_time = "Failed", message, iso(now)
    conds.set("Failed", True, reason, message)


def _cleanup_scale(job: GRPOJob, st: GRPOJobStatus) -> Scale:
    if job.spec.run_policy.clean_pod_policy == "None":
        return Scale(job.spec.trainer.replicas, autoscaling.rollout_replicas(job, st.autoscale))
    # Running and All both scale to zero: a StatefulSet or Deployment restarts any container that
    # exits, so no pod is left Completed to keep.
    return Scale(0, 0)


def _ttl_passed(job: Optional[GRPOJob], st: GRPOJobStatus, now: datetime) -> bool:
    ttl = job.spec.run_policy.ttl_seconds_after_finished if job else None
    done = parse_time(st.completion_time)
    return ttl is not None and done is not None and (now - done).total_seconds() >= ttl


def with_children(d: Decision, ok: bool, message: str, now: datetime, warnings: Sequence[str] = ()) -> Decision:
    """Record whether every child object is in place (after the controller created or repaired them);
    `warnings`: optional children left out (a monitoring CRD the cluster lacks)."""
    conds = Conditions(d.status, now, d.status.observed_generation)
    if not ok:
        conds.set("Created", False, "ChildError", message)
    elif warnings:
        conds.set("Created", True, "OptionalChildSkipped", "; ".join(warnings))
    else:
        conds.set("Created", True, "ChildrenCreated", message)
    if ok and d.status.phase == "Pending":
        d.status.phase = "Initializing"
        d.status.message = (f"waiting for pods: trainer {d.status.trainer.ready}/{d.status.trainer.desired}, "
                            f"rollout {d.status.rollout.ready}/{d.status.rollout.desired} ready")
    conds.write()
    return d


def with_suspend_request(d: Decision, error: str, now: datetime) -> Decision:
    """Record a failed POST /suspend (the next look asks again)."""
    if error:
        conds = Conditions(d.status, now, d.status.observed_generation)
        suspension.request_failed(conds, error)
        conds.write()
    return d
