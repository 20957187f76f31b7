"""spec.rollout.autoscale in `grpojob run`: the operator's rule (grpojob.api.autoscale.decide), acting
on rollout server processes instead of a Deployment's replicas.

The trainer's step records in metrics.jsonl are the signal (every step is read, as the operator
reads the last one at each look): its wait for groups, the step's time and the servers' idle
share. Scaling up starts `rollout-N` processes with fresh ports (N counts on from the highest
ever started, so a name is never reused); they register with the trainer's weight-sync store and
join at the current policy version, as a restarted server does. Scaling down sends SIGTERM to the
newest servers: they stop taking requests and close their engine, and the trainer's rollout
client sends the requests it had there to another server, so no group is lost. Each change is a
line in the run's output and in <run dir>/autoscale.jsonl.
"""
from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from grpojob.api.autoscale import KEPT, AutoscaleSpec, Decision, Signals, State, decide
from grpojob.local.processes import Child, free_port
from grpojob.local.progress import JsonlTail
from grpojob.plan import ENV_REPLICA_ID, ENV_ROLLOUT_PORT

DECISIONS_FILE = "autoscale.jsonl"


def another_server(template: Child, index: int) -> Child:
    """Rollout server `index`: the template's command and environment under its own name and port."""
    name = f"rollout-{index}"
    env = {**template.env, ENV_REPLICA_ID: name, ENV_ROLLOUT_PORT: str(free_port())}
    log = template.log_path.with_name(f"{name}.log") if template.log_path is not None else None
    return Child(name, list(template.argv), env, log)


def signals(record: dict[str, Any]) -> Optional[Signals]:
    """A metrics.jsonl step row as the rule's input; None for other rows."""
    if record.get("kind") is not None or record.get("step") is None:
        return None
    return Signals(step=int(record["step"]), wait_seconds=record.get("wait_seconds"),
                   step_seconds=record.get("step_seconds"), idle_fraction=record.get("rollout_idle_fraction"),
                   groups_in_flight=record.get("groups_in_flight"), policy_lag=record.get("policy_staleness"),
                   servers=len(record.get("rollouts") or []) or None)


class LocalAutoscaler:
    def __init__(self, spec: AutoscaleSpec, run_dir: Path, servers: list[Child],
                 make: Callable[[Child, int], Child] = another_server,
                 note: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic):
        assert servers, "autoscaling needs the run's first rollout server as a template"
        self.spec, self.make, self.note, self.clock = spec, make, note, clock
        self.servers = list(servers)  # running, oldest first
        self.template = servers[0]
        self.next_index = len(servers)
        self.state = State(replicas=len(servers))
        self.metrics = run_dir / "metrics.jsonl"
        self.log = run_dir / DECISIONS_FILE
        self.tail = JsonlTail(self.metrics)  # a resumed run: new steps only

    def _new_rows(self) -> list[dict[str, Any]]:
        out = []
        for line in self.tail.lines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def poll(self) -> tuple[list[Child], list[Child]]:
        """Read the steps recorded since the last call, decide on each, and act: (servers started,
        servers asked to stop). Call it from the thread that started the run's children."""
        started: list[Child] = []
        stopped: list[Child] = []
        for row in self._new_rows():
            s = signals(row)
            if s is None:
                continue
            d = decide(self.spec, self.state, s, self.clock())
            self.state = d.state
            if d.kept:
                self._record(KEPT, d.replicas, d.kept, d.state.last_step)
            if d.changed:
                a, b = self._act(d)
                started += a
                stopped += b
        return started, stopped

    def _act(self, d: Decision) -> tuple[list[Child], list[Child]]:
        started: list[Child] = []
        stopped: list[Child] = []
        while len(self.servers) < d.replicas:
            child = self.make(self.template, self.next_index)
            self.next_index += 1
            child.start()
            self.servers.append(child)
            started.append(child)
        while len(self.servers) > d.replicas:
            child = self.servers.pop()
            child.signal(signal.SIGTERM)
            stopped.append(child)
        self.state = replace(self.state, replicas=len(self.servers))
        self._record(d.reason, d.replicas, d.message, d.state.last_step, started, stopped)
        return started, stopped

    def _record(self, reason: str, replicas: int, message: str, step: int, started: Sequence[Child] = (),
                stopped: Sequence[Child] = ()) -> None:
        """A line in the run's output and in autoscale.jsonl."""
        self.note(f"autoscale: {reason}: {message}" + "".join(f"; started {c.name}" for c in started)
                  + "".join(f"; stopping {c.name}" for c in stopped))
        with open(self.log, "a") as f:
            f.write(json.dumps({"time": time.time(), "step": step, "replicas": replicas, "reason": reason,
                                "message": message, "started": [c.name for c in started],
                                "stopped": [c.name for c in stopped]}) + "\n")

