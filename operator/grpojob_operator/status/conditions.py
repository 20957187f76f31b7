"""Conditions and the Events their transitions become.

Every condition carries a lastTransitionTime (from the first status on), and a condition keeps it
until its status changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Optional

from grpojob.api import GRPOJobStatus
from grpojob.api.status import CONDITION_TYPES, Condition

from . import waiting

# Conditions whose True state is also a phase: their transition events stand for the phase change.
PHASE_CONDITIONS = {"Running", "Suspended", "Succeeded", "Failed"}
_BAD_WHEN_TRUE = {"Failed", "InvalidSpec"}
_BAD_WHEN_LOST = {"TrainerReady", "RolloutReady", "WeightsInSync", "TrainerReachable"}
# Reasons that are a warning whatever the status, and whose message is news each time it changes.
WARNING_REASONS = {"ChildError", "OptionalChildSkipped", "Unreachable", "CheckpointTimeout", "TrainerStopped",
                   "CheckpointRequestFailed", "SuspendRefused"}
_UNKNOWN_AT_START = {"WeightsInSync", "TrainerReachable"}
_EXPECTED_LOSS = {"ScaledDown", "NotRunning"}  # pods scaled away on purpose (suspend, cleanup)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Optional[str]) -> Optional[datetime]:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def initial_status(now: datetime) -> GRPOJobStatus:
    return GRPOJobStatus(conditions=[
        Condition(type=t, status="Unknown" if t in _UNKNOWN_AT_START else "False", reason="Pending",
                  last_transition_time=iso(now))
        for t in CONDITION_TYPES])


def parse_status(raw: Optional[Mapping], now: datetime) -> GRPOJobStatus:
    """The status as last written; anything unreadable (hand edits, older fields) starts afresh."""
    if not raw:
        return initial_status(now)
    known = {k: v for k, v in dict(raw).items() if k in GRPOJobStatus.model_fields
             or k in {f.alias for f in GRPOJobStatus.model_fields.values()}}
    try:
        st = GRPOJobStatus.model_validate(known)
    except ValueError:
        return initial_status(now)
    have = {c.type for c in st.conditions}
    st.conditions += [c for c in initial_status(now).conditions if c.type not in have]
    return st


class Conditions:
    """The conditions of one status being decided, by type."""

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
        changed = old is None or old.status != value or old.last_transition_time is None
        self.by_type[type_] = Condition(
            type=type_, status=value, reason=reason, message=message,
            last_transition_time=iso(self.now) if changed else old.last_transition_time,
            observed_generation=self.generation)

    def drop(self, type_: str) -> None:
        """No such condition any more (JudgeReady once the job has no judge left)."""
        self.by_type.pop(type_, None)

    def write(self) -> None:
        order = list(CONDITION_TYPES) + sorted(set(self.by_type) - set(CONDITION_TYPES))
        self.st.conditions = [self.by_type[t] if self.by_type[t].last_transition_time else
                              self.by_type[t].model_copy(update={"last_transition_time": iso(self.now)})
                              for t in order if t in self.by_type]


def transitions(prev: GRPOJobStatus, new: GRPOJobStatus) -> list[Event]:
    """Kubernetes Events for what changed: every condition transition, each new warning (a child
    error, an unreachable trainer...), and the phases that have no condition of their own."""
    out: list[Event] = []
    before = {c.type: c for c in prev.conditions}
    for c in new.conditions:
        old = before.get(c.type)
        if old is None:
            continue
        warning = c.reason in WARNING_REASONS or c.reason in waiting.WARNING_REASONS
        moved = old.status != c.status and not (old.reason == "Pending" and c.status != "True")
        if c.reason in waiting.WARNING_REASONS:  # a pod's problem: news when it first shows, not per look
            news = waiting.news_key(old.reason, old.message) != waiting.news_key(c.reason, c.message)
        else:
            news = warning and (old.reason, old.message) != (c.reason, c.message)
        if not (moved or news):
            continue
        bad = warning or (c.type in _BAD_WHEN_TRUE and c.status == "True") or \
            (c.type in _BAD_WHEN_LOST and old.status == "True" and c.reason not in _EXPECTED_LOSS)
        text = f"{c.type}={c.status}" + (f": {c.message}" if c.message else "")
        out.append(Event("Warning" if bad else "Normal", c.reason or c.type, text))
    if prev.phase != new.phase and new.phase not in PHASE_CONDITIONS:
        out.append(Event("Normal", new.phase, new.message))
    return out
