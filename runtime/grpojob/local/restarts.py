"""How `grpojob run` restarts a child process that died, as a cluster restarts its pod.

On a cluster every process runs in a pod whose controller restarts it: the rollout servers' and
environments' Deployments, the trainer's StatefulSet (which resumes from its checkpoint). The
kubelet backs off exponentially and, after a container ran 10 minutes without trouble, starts
counting afresh. A local run does the same but gives up after `max_restarts` restarts of one
child (`grpojob run --max-restarts`): a laptop has nobody to page.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from grpojob.checkpoint import objects
from grpojob.local.processes import Child


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 3  # per child, before the run stops
    first_delay: float = 1.0  # seconds before the first restart; doubles at each one
    max_delay: float = 30.0
    reset_after: float = 600.0  # a child that ran this long counts its restarts afresh (the kubelet's 10 min)

    def delay(self, restarts: int) -> float:
        return min(self.max_delay, self.first_delay * 2 ** restarts)


@dataclass
class Restarts:
    policy: RestartPolicy
    count: dict[str, int] = field(default_factory=dict)  # child name -> restarts in a row
    due: dict[str, tuple[float, Child]] = field(default_factory=dict)  # child name -> (when, child)

    def schedule(self, child: Child) -> Optional[float]:
        """Plan the restart of `child`, which just exited: the delay, or None when it was
        restarted max_restarts times in a row already."""
        now = time.monotonic()
        n = 0 if now - child.started_at >= self.policy.reset_after else self.count.get(child.name, 0)
        if n >= self.policy.max_restarts:
            return None
        self.count[child.name] = n + 1
        delay = self.policy.delay(n)
        self.due[child.name] = (now + delay, child)
        return delay

    def ready(self) -> list[Child]:
        """The children whose back-off is over (taken off the schedule)."""
        now = time.monotonic()
        out = [c for when, c in self.due.values() if when <= now]
        for c in out:
            del self.due[c.name]
        return out


def what_happened(dead: Child) -> str:
    """A child's exit in one line: its code (a signal by name) and the ranks killed outright
    (torchrun's word: such a rank says nothing itself, and its peers fail on the broken
    connection), then why: its termination message, else torchrun's word on its ranks, else its
    last logged error."""
    code = dead.poll()
    said = f"{dead.name} exited with code {code}" + (f" ({signal.strsignal(-code)})" if code and code < 0 else "")
    ranks = dead.rank_failures()
    killed = [r for r in ranks if "killed by signal" in r]
    # torchrun stops the surviving ranks with SIGTERM after a failure: no cause of it, unless
    # every rank got one (the pod itself was stopped)
    killed = [r for r in killed if f"signal {signal.SIGTERM.value} " not in r] or killed
    if killed:
        said += f" ({', '.join(killed)})"
    why = dead.termination()
    if why:
        return said + f": {why[0]}: {why[1]}"
    if ranks:  # torchrun's own report is no error of the child's
        return said + (f": {', '.join(r for r in ranks if r not in killed)}" if ranks != killed else "")
    err = dead.last_error()
    return said + (f"; its last error: {err}" if err else "")


def resumes_from(checkpoints: str | Path) -> str:
    """What a restarted trainer will do, told before it does it: the step it resumes after (the
    steps trained since are trained again), or starting over. `checkpoints`: a directory or an
    object store's URL."""
    found = objects.committed(checkpoints)
    if not found:
        return "; it starts over (no checkpoint yet)"
    step, newest = found[-1]
    return f"; it resumes from {str(newest).rstrip('/').rsplit('/', 1)[-1]} (the steps after {step} are trained again)"
