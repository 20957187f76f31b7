"""The trainer's view of its judges (spec.judges): what its /metrics says of them, and how long
onFailure skip may wait for one that scores nothing.

Metrics (grpojob.metrics_names.TRAINER_JUDGES), per judge, in one registry of the process that the
trainer leader's /metrics serves with its own (grpojob.leader.server): the time of each answered
scoring request as the trainer sees it (network, the judge's queue and its forward passes), the
requests in flight, the failed attempts by reason, and the groups left unscored after the retries.
Every scorer of the process (training, evaluation, agent sessions) counts into the same series.

The bound: with onFailure skip a group the judge cannot score is generated again, so a judge that
never comes back would make the trainer skip groups for ever, a hang by another name. A judge that
has scored no group for its startupTimeoutSeconds (the patience the trainer has for it at start:
a restarted judge pod loads its model again), over at least MIN_GROUPS unscored groups in a row,
is down: the step fails with the judge's error, as onFailure fail does.
"""
from __future__ import annotations

import time
from typing import Optional

from prometheus_client import CollectorRegistry

from grpojob import prom
from grpojob.api.judge import JudgeSpec
from grpojob.metrics_names import TRAINER_JUDGES

REGISTRY = CollectorRegistry()
METRICS = prom.build(TRAINER_JUDGES, REGISTRY)
# Why an attempt failed (the reason label): no answer in timeoutSeconds, no connection, a 5xx, a 4xx
# (the request refused), an answer with the wrong number of scores, a generative judge's answer its
# parser could not read, no replica ready within startupTimeoutSeconds.
REASONS = ("timeout", "connection", "server_error", "refused", "bad_answer", "unparsed", "not_ready")
MIN_GROUPS = 2  # unscored groups in a row, at least, before a judge counts as down


class JudgeWatch:
    """One client's view of its judge: its series, and the outage it is in (none while it scores)."""

    def __init__(self, spec: JudgeSpec, where: str):
        self.name, self.where, self.patience = spec.name, where, float(spec.startup_timeout_seconds)
        self._seconds = METRICS["grpojob_trainer_judge_request_seconds"].labels(spec.name)
        self._in_flight = METRICS["grpojob_trainer_judge_requests_in_flight"].labels(spec.name)
        self._unscored = METRICS["grpojob_trainer_judge_unscored_groups_total"].labels(spec.name)
        self._down_since: Optional[float] = None  # the first unscored group's start, since the last scored one
        self._groups = 0  # unscored groups since the last scored one

    def sent(self) -> None:
        self._in_flight.inc()

    def done(self) -> None:
        """The request sent() counted has its answer, or failed."""
        self._in_flight.dec()

    def answered(self, seconds: float) -> None:
        self._seconds.observe(seconds)

    def failed(self, reason: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"judge failure reason '{reason}': use one of {', '.join(REASONS)}")
        METRICS["grpojob_trainer_judge_failures_total"].labels(self.name, reason).inc()

    def scored(self) -> None:
        self._down_since, self._groups = None, 0

    def unscored(self, started: float, now: Optional[float] = None) -> Optional[str]:
        """A group (whose scoring began at monotonic `started`) is left unscored. Returns why the
        judge counts as down (onFailure skip gives up), or None."""
        now = time.monotonic() if now is None else now
        self._unscored.inc()
        self._groups += 1
        if self._down_since is None:
            self._down_since = started
        down = now - self._down_since
        if self._groups < MIN_GROUPS or down < self.patience:
            return None
        return (f"judge '{self.name}' ({self.where}) has scored no group for {down:.0f} s ({self._groups} groups "
                f"unscored in a row), its startupTimeoutSeconds ({self.patience:g} s): it is down, so onFailure "
                "skip stops skipping and the step fails")
