"""What a job's pods and its trainer's report mean: phase, conditions, progress, and what to do next.

Pure functions of (job, previous status, observation, now). The controller gathers the observation
(pods from kopf's index, the trainer leader's /status), calls `decide`, does what the decision asks
(children, /suspend, deletion), then `with_children` records whether the children are in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Mapping, Optional, Sequence

from grpojob.api import FieldError, GRPOJob, GRPOJobStatus, TrainerStatus
from grpojob.api.status import CONDITION_TYPES, Condition, Progress, ReplicaStatus

from .children import Scale

TERMINAL = ("Succeeded", "Failed")
ACTIVE_TRAINER = ("starting", "running", "checkpointing")  # a trainer that can still checkpoint
# Conditions whose True state is also a phase: their transition events stand for the phase change.
_PHASE_CONDITIONS = {"Running", "Suspended", "Succeeded", "Failed"}
_BAD_WHEN_TRUE = {"Failed", "InvalidSpec"}
_BAD_WHEN_LOST = {"TrainerReady", "RolloutReady", "WeightsInSync"}


@dataclass(frozen=True)
class PodView:
    """The parts of a pod the operator reads (kept in kopf's in-memory index)."""
    name: str
    uid: str
    role: str  # trainer | rollout
    phase: str = "Pending"
    ready: bool = False
    restarts: int = 0  # container restarts
    message: str = ""  # why the last container run ended
    deleting: bool = False
    clean_exit: bool = False  # the last container run ended with exit code 0

    @property
    def failures(self) -> int:
        """Runs of this pod that ended in failure: container restarts, plus one for a Failed pod."""
        return self.restarts + (1 if self.phase == "Failed" else 0)


@dataclass(frozen=True)
class Observation:
    now: datetime
    trainer_pods: Sequence[PodView] = ()
    rollout_pods: Sequence[PodView] = ()
    trainer: Optional[TrainerStatus] = None  # the leader's /status, None when unreachable
    trainer_error: str = ""
    ledger: Mapping[str, int] = field(default_factory=dict)  # pod uid -> failures already counted


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: GRPOJobStatus
    scale: Scale
    ensure_children: bool  # create or repair the children (not for an invalid spec)
    ledger: dict[str, int]
    request_suspend: bool = False  # POST /suspend to the trainer leader
    delete_job: bool = False  # ttlSecondsAfterFinished has passed


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Optional[str]) -> Optional[datetime]:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def initial_status() -> GRPOJobStatus:
    return GRPOJobStatus(conditions=[
        Condition(type=t, status="Unknown" if t == "WeightsInSync" else "False", reason="Pending")
        for t in CONDITION_TYPES])


def parse_status(raw: Optional[Mapping]) -> GRPOJobStatus:
    """The status as last written; anything unreadable (hand edits, older fields) starts afresh."""
    if not raw:
        return initial_status()
    known = {k: v for k, v in dict(raw).items() if k in GRPOJobStatus.model_fields
             or k in {f.alias for f in GRPOJobStatus.model_fields.values()}}
    try:
        st = GRPOJobStatus.model_validate(known)
    except ValueError:
        return initial_status()
    have = {c.type for c in st.conditions}
    st.conditions += [c for c in initial_status().conditions if c.type not in have]
    return st


class _Conditions:
    def __init__(self, st: GRPOJobStatus, now: datetime, generation: Optional[int]):
        self.by_type = {c.type: c for c in st.conditions}
        self.st, self.now, self.generation = st, now, generation

    def get(self, type_: str) -> Condition:
        return self.by_type[type_]

    def is_(self, type_: str, status: str = "True", reason: Optional[str] = None) -> bool:
        c = self.by_type.get(type_)
        return c is not None and c.status == status and (reason is None or c.reason == reason)

    def set(self, type_: str, status: bool | str, reason: str, message: str = "") -> None:
        value = status if isinstance(status, str) else ("True" if status else "False")
        old = self.by_type.get(type_)
        changed = old is None or old.status != value
        self.by_type[type_] = Condition(
            type=type_, status=value, reason=reason, message=message,
            last_transition_time=iso(self.now) if changed or old.last_transition_time is None
            else old.last_transition_time,
            observed_generation=self.generation)

    def write(self) -> None:
        order = list(CONDITION_TYPES) + sorted(set(self.by_type) - set(CONDITION_TYPES))
        self.st.conditions = [self.by_type[t] for t in order if t in self.by_type]


def count_restarts(ledger: Mapping[str, int], pods: Iterable[PodView]) -> tuple[int, dict[str, int]]:
    """New trainer failures since the ledger, and the updated ledger.

    One torchrun group failure restarts every trainer pod, so the new failures of a look are the
    largest per-pod increase, not the sum. A restart after exit code 0 (the trainer finished or
    was suspended) is not a failure."""
    new_ledger: dict[str, int] = {}
    delta = 0
    for p in pods:
        before = ledger.get(p.uid, 0)
        new = p.failures - before
        if new > 0 and p.clean_exit:
            new -= 1
        delta = max(delta, new)
        new_ledger[p.uid] = max(p.failures, before)
    return delta, new_ledger


def _leader_exited_cleanly(ledger: Mapping[str, int], pods: Iterable[PodView]) -> bool:
    """Trainer pod 0 ran to its end with exit code 0 since the last look (its StatefulSet restarts
    it): the trainer completed, or it was suspended."""
    return any(p.name.endswith("-0") and p.clean_exit and p.failures > ledger.get(p.uid, 0) for p in pods)


def _progress(prev: Progress, t: Optional[TrainerStatus]) -> Progress:
    if t is None:
        return prev
    return Progress(step=t.step, total_steps=t.total_steps, policy_version=t.policy_version,
                    reward_mean=t.reward_mean, kl=t.kl, tokens_per_second=t.tokens_per_second,
                    last_checkpoint_step=t.last_checkpoint_step, weights_in_sync=t.weights_in_sync)


def _ready(pods: Sequence[PodView]) -> int:
    return sum(1 for p in pods if p.ready and p.phase == "Running" and not p.deleting)


def _leader_up(pods: Sequence[PodView]) -> bool:
    return any(p.name.endswith("-0") and p.phase == "Running" and not p.deleting for p in pods)


def _last_failure(obs: Observation) -> str:
    if obs.trainer and obs.trainer.message:
        return obs.trainer.message
    msgs = [f"{p.name}: {p.message}" for p in obs.trainer_pods if p.message]
    return "; ".join(msgs)


def _cleanup_scale(job: GRPOJob) -> Scale:
    if job.spec.run_policy.clean_pod_policy == "None":
        return Scale(job.spec.trainer.replicas, job.spec.rollout.replicas)
    # Running and All both scale to zero: a StatefulSet or Deployment restarts any container that
    # exits, so no pod is left Completed to keep.
    return Scale(0, 0)


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
    conds = _Conditions(st, now, generation)
    ledger = dict(obs.ledger)

    if errors or job is None:
        msg = "; ".join(str(e) for e in errors) or "invalid spec"
        conds.set("InvalidSpec", True, "InvalidSpec", msg)
        conds.set("Failed", True, "InvalidSpec", msg)
        conds.set("Running", False, "InvalidSpec")
        st.phase, st.message = "Failed", f"invalid spec: {msg}"
        st.completion_time = st.completion_time or iso(now)
        conds.write()
        return Decision(st, Scale(0, 0), ensure_children=False, ledger=ledger,
                        delete_job=_ttl_passed(job, st, now))

    if conds.is_("InvalidSpec", reason="InvalidSpec"):  # the spec was fixed: start over
        conds.set("Failed", False, "SpecFixed")
        st.phase, st.completion_time = "Pending", None
    if rejected:
        conds.set("InvalidSpec", True, rejected_reason, "; ".join(rejected))
    else:
        conds.set("InvalidSpec", False, "Valid")

    spec = job.spec
    trainer_ready, rollout_ready = _ready(obs.trainer_pods), _ready(obs.rollout_pods)
    st.progress = _progress(st.progress, obs.trainer)
    if obs.trainer is not None and obs.trainer.weights_in_sync is not None:
        conds.set("WeightsInSync", obs.trainer.weights_in_sync,
                  "Synced" if obs.trainer.weights_in_sync else "Behind",
                  f"policy version {obs.trainer.policy_version}")

    def finish(scale: Scale, **kw) -> Decision:
        st.trainer = ReplicaStatus(desired=scale.trainer, ready=trainer_ready)
        st.rollout = ReplicaStatus(desired=scale.rollout, ready=rollout_ready)
        _readiness(conds, "TrainerReady", "trainer", trainer_ready, scale.trainer)
        _readiness(conds, "RolloutReady", "rollout", rollout_ready, scale.rollout)
        conds.set("Running", st.phase == "Running", st.phase)
        conds.write()
        return Decision(st, scale, ensure_children=True, ledger=ledger, **kw)

    # Finished jobs: keep the outcome, clean up, and go away after the TTL.
    if st.phase in TERMINAL:
        _, ledger = count_restarts(ledger, obs.trainer_pods)
        return finish(_cleanup_scale(job), delete_job=_ttl_passed(job, st, now))

    susp = spec.run_policy.suspend
    checkpointing = conds.is_("Suspended", "Unknown", "Checkpointing")
    suspended = conds.is_("Suspended")
    reported = obs.trainer is not None and obs.trainer.phase == "completed"
    # The trainer exits 0 when done and its pod restarts: a look between polls may miss "completed".
    exited = not (susp or checkpointing or suspended) and _leader_exited_cleanly(ledger, obs.trainer_pods)
    completed = reported or exited

    # Trainer failures count against backoffLimit, except exits asked for by a suspend.
    delta, ledger = count_restarts(ledger, obs.trainer_pods)
    if not (susp or checkpointing or suspended or completed):
        st.restarts += delta

    if susp:
        request = False
        trainer_phase = obs.trainer.phase if obs.trainer else None
        if suspended:
            done, reason, msg = True, None, None
        elif checkpointing:
            since = parse_time(conds.get("Suspended").last_transition_time) or now
            if trainer_phase == "suspended" or trainer_phase is None or not _leader_up(obs.trainer_pods):
                done, reason, msg = True, "Checkpointed", "trainer checkpointed at step " \
                    f"{st.progress.last_checkpoint_step if st.progress.last_checkpoint_step is not None else st.progress.step}"
            elif (now - since).total_seconds() > suspend_timeout:
                done, reason, msg = True, "CheckpointTimeout", \
                    f"no checkpoint confirmed within {suspend_timeout:.0f}s; scaling down (SIGTERM checkpoints too)"
            else:
                done, reason, msg = False, None, None
                request = trainer_phase in ("starting", "running")  # ask again: the first ask may be lost
        elif trainer_phase in ACTIVE_TRAINER and _leader_up(obs.trainer_pods):
            conds.set("Suspended", "Unknown", "Checkpointing", "asked the trainer to checkpoint and stop")
            done, reason, msg, request = False, None, None, trainer_phase != "checkpointing"
        else:
            done, reason, msg = True, "Suspended", "no running trainer to checkpoint"
        if done:
            if reason:
                conds.set("Suspended", True, reason, msg or "")
            st.phase, st.message = "Suspended", "suspended: resume with spec.runPolicy.suspend=false"
            return finish(Scale(0, 0))
        st.message = "checkpointing before suspend"
        return finish(Scale(spec.trainer.replicas, spec.rollout.replicas), request_suspend=request)

    if suspended or checkpointing:
        conds.set("Suspended", False, "Resumed", "resuming from the newest checkpoint")
        st.start_time = None  # like a Kubernetes Job, the active deadline restarts on resume
        st.phase = "Pending"
    elif conds.get("Suspended").reason == "Pending":
        conds.set("Suspended", False, "NotSuspended")

    scale = Scale(spec.trainer.replicas, spec.rollout.replicas)
    if st.start_time is None and any(p.phase == "Running" for p in obs.trainer_pods):
        st.start_time = iso(now)
    start = parse_time(st.start_time)
    deadline = spec.run_policy.active_deadline_seconds

    if st.restarts > spec.run_policy.backoff_limit:
        why = _last_failure(obs)
        _fail(conds, st, now, "BackoffLimitExceeded", f"trainer failed {st.restarts} times "
              f"(backoffLimit {spec.run_policy.backoff_limit})" + (f": {why}" if why else ""))
        return finish(_cleanup_scale(job))
    if deadline and start and (now - start).total_seconds() > deadline:
        _fail(conds, st, now, "DeadlineExceeded", f"ran longer than activeDeadlineSeconds ({deadline}s)")
        return finish(_cleanup_scale(job))
    if completed:
        st.phase, st.completion_time = "Succeeded", iso(now)
        st.message = f"trained {st.progress.step}/{st.progress.total_steps} steps" if reported else \
            f"trainer exited 0 (last seen at step {st.progress.step}/{st.progress.total_steps or spec.training.steps})"
        conds.set("Succeeded", True, "Completed", st.message)
        return finish(_cleanup_scale(job))

    if trainer_ready >= scale.trainer and rollout_ready >= 1:
        st.phase = "Running"
        st.message = f"step {st.progress.step}/{st.progress.total_steps or spec.training.steps}"
    elif conds.is_("Created"):
        st.phase = "Initializing"
        st.message = (f"waiting for pods: trainer {trainer_ready}/{scale.trainer}, "
                      f"rollout {rollout_ready}/{scale.rollout} ready")
    else:
        st.phase, st.message = "Pending", "creating child objects"
    return finish(scale)


def _fail(conds: _Conditions, st: GRPOJobStatus, now: datetime, reason: str, message: str) -> None:
    st.phase, st.message, st.completion_time = "Failed", message, iso(now)
    conds.set("Failed", True, reason, message)


def _readiness(conds: _Conditions, type_: str, role: str, ready: int, desired: int) -> None:
    if desired == 0:
        conds.set(type_, False, "ScaledDown", f"no {role} pods wanted")
    elif ready >= desired:
        conds.set(type_, True, "AllReady", f"{ready}/{desired} {role} pods ready")
    else:
        conds.set(type_, False, "Waiting", f"{ready}/{desired} {role} pods ready")


def _ttl_passed(job: Optional[GRPOJob], st: GRPOJobStatus, now: datetime) -> bool:
    ttl = job.spec.run_policy.ttl_seconds_after_finished if job else None
    done = parse_time(st.completion_time)
    return ttl is not None and done is not None and (now - done).total_seconds() >= ttl


def with_children(d: Decision, ok: bool, message: str, now: datetime) -> Decision:
    """Record whether every child object is in place (after the controller created or repaired them)."""
    conds = _Conditions(d.status, now, d.status.observed_generation)
    if ok:
        conds.set("Created", True, "ChildrenCreated", message)
        if d.status.phase == "Pending":
            d.status.phase = "Initializing"
            d.status.message = (f"waiting for pods: trainer {d.status.trainer.ready}/{d.status.trainer.desired}, "
                                f"rollout {d.status.rollout.ready}/{d.status.rollout.desired} ready")
    else:
        conds.set("Created", False, "ChildError", message)
    conds.write()
    return d


def transitions(prev: GRPOJobStatus, new: GRPOJobStatus) -> list[Event]:
    """Kubernetes Events for what changed: every condition transition, and the phases that have no
    condition of their own."""
    out: list[Event] = []
    before = {c.type: c for c in prev.conditions}
    for c in new.conditions:
        old = before.get(c.type)
        if old is None or old.status == c.status or (old.reason == "Pending" and c.status != "True"):
            continue
        bad = (c.type in _BAD_WHEN_TRUE and c.status == "True") or \
              (c.type in _BAD_WHEN_LOST and old.status == "True" and c.reason != "ScaledDown")
        text = f"{c.type}={c.status}" + (f": {c.message}" if c.message else "")
        out.append(Event("Warning" if bad else "Normal", c.reason or c.type, text))
    if prev.phase != new.phase and not (new.phase in _PHASE_CONDITIONS):
        out.append(Event("Normal", new.phase, new.message))
    return out
