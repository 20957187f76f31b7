"""What the controller saw of a job: its pods (from kopf's index) and its trainer leader's report."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Mapping, Optional, Sequence

from grpojob.api import TrainerStatus, plugins

from .waiting import PodProblem


@dataclass(frozen=True)
class PodView:
    """The parts of a pod the operator reads (kept in kopf's in-memory index)."""
    name: str
    uid: str
    role: str  # trainer | rollout | environment
    phase: str = "Pending"
    ready: bool = False
    restarts: int = 0  # container restarts
    message: str = ""  # why the last container run ended
    deleting: bool = False
    clean_exit: bool = False  # the last container run ended with exit code 0
    # A runtime process that could not load the job's user code: (reason, message) from its
    # termination message (grpojob.api.plugins.parse_failure), e.g. PluginImportFailed.
    failure: Optional[tuple[str, str]] = None
    # Trainer: the final step its termination message reports (plugins.parse_completion): written
    # when training completed, read however the container ended since.
    completed_step: Optional[int] = None
    # Rollout: the engine's error its last run ended with (plugins.parse_engine_failure).
    engine_failure: Optional[str] = None
    # What keeps it from starting or running (waiting.pod_problem): unschedulable, an image that
    # does not pull, a crash loop...
    problem: Optional[PodProblem] = None

    @property
    def failures(self) -> int:
        """Runs of this pod that ended in failure: container restarts, plus one for a Failed pod."""
        return self.restarts + (1 if self.phase == "Failed" else 0)

    @property
    def leader(self) -> bool:
        return self.role == "trainer" and self.name.endswith("-0")


@dataclass(frozen=True)
class Observation:
    now: datetime
    trainer_pods: Sequence[PodView] = ()
    rollout_pods: Sequence[PodView] = ()
    trainer: Optional[TrainerStatus] = None  # the leader's /status, None when not read
    trainer_error: str = ""  # why /status could not be read ("" when it was not tried)
    ledger: Mapping[str, int] = field(default_factory=dict)  # pod uid -> failures already counted
    environment_pods: Sequence[PodView] = ()  # spec.environments' pods (their spec.code install may fail)
    judge_pods: Sequence[PodView] = ()  # spec.judges' pods

    @property
    def polled(self) -> bool:
        """The controller asked the leader for /status this time (its pod was running)."""
        return self.trainer is not None or bool(self.trainer_error)


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


def engine_failures(ledger: Mapping[str, int], pods: Iterable[PodView]) -> tuple[list[str], dict[str, int]]:
    """Rollout servers restarted since the ledger whose last run ended with an engine failure
    ("<pod>: <error>", one per pod and look), and the ledger's entries for these pods. The kubelet
    restarts them; each termination is reported once (the ledger outlives the operator)."""
    out, new_ledger = [], {}
    for p in pods:
        if p.failures > ledger.get(p.uid, 0) and p.engine_failure:
            out.append(f"{p.name}: {p.engine_failure}")
        new_ledger[p.uid] = max(p.failures, ledger.get(p.uid, 0))
    return out, new_ledger


def leader_exited_cleanly(ledger: Mapping[str, int], pods: Iterable[PodView]) -> bool:
    """Trainer pod 0 ran to its end with exit code 0 since the last look (its StatefulSet restarts it)."""
    return any(p.leader and p.clean_exit and p.failures > ledger.get(p.uid, 0) for p in pods)


def leader_completed(pods: Iterable[PodView], steps: int) -> bool:
    """Trainer pod 0's termination message says training completed at its last step."""
    return any(p.leader and p.completed_step is not None and p.completed_step >= steps for p in pods)


def ready_count(pods: Sequence[PodView]) -> int:
    return sum(1 for p in pods if p.ready and p.phase == "Running" and not p.deleting)


def running_count(pods: Sequence[PodView]) -> int:
    """Pods whose containers run (ready or not: a readiness probe lags by up to its period)."""
    return sum(1 for p in pods if p.phase == "Running" and not p.deleting)


def leader_up(pods: Sequence[PodView]) -> bool:
    return any(p.leader and p.phase == "Running" and not p.deleting for p in pods)


def leader_ready(pods: Sequence[PodView]) -> bool:
    """Pod 0 passes its readiness probe: the trainer's HTTP endpoint answers the kubelet."""
    return any(p.leader and p.phase == "Running" and p.ready and not p.deleting for p in pods)


def plugin_failure(obs: Observation) -> Optional[tuple[str, str]]:
    """(reason, message) when a trainer, rollout or environment process said it cannot load the
    job's user code (it fails the same way on every restart), from the leader's /status or a pod's
    termination message; None otherwise."""
    t = obs.trainer
    if t is not None and t.phase == "failed":
        found = plugins.parse_failure(t.message)
        if found:
            return found
    for p in (*obs.trainer_pods, *obs.rollout_pods, *obs.environment_pods):
        if p.failure and not p.deleting:
            reason, message = p.failure
            return reason, f"{p.name}: {message}"
    return None


def last_failure(obs: Observation) -> str:
    if obs.trainer and obs.trainer.message:
        return obs.trainer.message
    return "; ".join(f"{p.name}: {p.message}" for p in obs.trainer_pods if p.message)
