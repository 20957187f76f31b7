"""Submitted groups waiting for a training step, per environment (the RolloutManager's side of the
trajectory API). Used only from the manager's event loop: no locks.

Registration. An environment registers under a name (replicas of one environment share it), with
how many groups it commits to per step (`groups_per_step`) or none. Commitments are reserved: each
step waits for them and the trainer's own workflow generates only the rest of promptsPerStep.
Groups of environments without a commitment are taken as they come, oldest first, ahead of the
workflow's (whose displaced groups stay ready for the next step).

Versions. A group is accepted when its version is at least the floor (published - maxStaleness)
and at most the next version the trainer will publish; a queued group that falls below the floor
when a new version is published is dropped and counted (an environment's group cannot be
generated again by the trainer). The queue holds at most Pipeline.queue_limit groups.

Checkpoints. Registrations and queued groups are part of the manager's state: a resumed trainer
knows its environments and trains the groups it had accepted.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from grpojob.contracts.rollout import Completion, Group, Sample


class Refused(Exception):
    """A registration or submission the trainer does not take: HTTP status, reason, message."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


@dataclass
class Queued:
    group: Group
    version: int
    environment: str
    received: float = field(default_factory=time.monotonic)


@dataclass
class Registration:
    name: str
    groups_per_step: Optional[int]
    registered: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    queue: deque = field(default_factory=deque)  # of Queued, oldest first
    accepted: int = 0
    trained: int = 0
    stale: int = 0  # accepted, then dropped below the floor before a step took it
    refused: Counter = field(default_factory=Counter)  # reason -> groups


class EnvironmentQueue:
    def __init__(self, prompts_per_step: int, limit: int, expected: Iterable[str] = ()):
        self.prompts_per_step, self.limit = prompts_per_step, limit
        self.expected = tuple(expected)  # spec.environments names (they may register late, or never)
        self.envs: dict[str, Registration] = {}
        self.refused_unknown: Counter = Counter()  # refusals of submissions by no registered name
        self._step_stale: Counter = Counter()

    # ---- registration and submission --------------------------------------------------------------
    def register(self, name: str, groups_per_step: Optional[int]) -> Registration:
        others = {n: r.groups_per_step for n, r in self.envs.items() if n != name and r.groups_per_step}
        if groups_per_step and sum(others.values()) + groups_per_step > self.prompts_per_step:
            held = ", ".join(f"{n}: {q}" for n, q in others.items()) or "none"
            raise Refused(409, "over_committed", f"groups_per_step {groups_per_step} does not fit: "
                          f"training.promptsPerStep is {self.prompts_per_step} and other environments "
                          f"commit to {sum(others.values())} ({held})")
        reg = self.envs.get(name)
        if reg is None:
            reg = self.envs[name] = Registration(name, groups_per_step)
        reg.groups_per_step, reg.last_seen = groups_per_step, time.monotonic()
        return reg

    def submit(self, name: str, groups: list[tuple[Group, int]], floor: int, newest: int) -> int:
        """Queue (group, version) pairs, all or none."""
        reg = self.envs.get(name)
        if reg is None:
            self.refused_unknown["unregistered"] += len(groups)
            raise Refused(404, "unregistered", f"environment '{name}' is not registered: POST register first "
                          "(a trainer that restarted without a checkpoint forgets registrations)")
        reg.last_seen = time.monotonic()
        versions = [v for _, v in groups]
        why = None
        if max(versions) > newest:
            why = Refused(400, "future", f"policy version {max(versions)} (groups[{versions.index(max(versions))}]) "
                          f"does not exist yet: the newest the rollout servers can hold is {newest}")
        elif min(versions) < floor:
            old = [i for i, v in enumerate(versions) if v < floor]
            why = Refused(409, "stale", f"groups {old} are of policy version {min(versions)}, below the floor "
                          f"{floor} (published version - algorithm.maxStaleness): generate them again")
        elif self.queued() + len(groups) > self.limit:
            why = Refused(429, "full", f"the queue holds {self.queued()} groups, its limit is {self.limit} "
                          "((maxStaleness + 1) x everySteps x promptsPerStep): retry after the next step")
        if why is not None:
            reg.refused[why.reason] += len(groups)
            raise why
        for group, version in groups:
            reg.queue.append(Queued(group, version, name))
        reg.accepted += len(groups)
        return len(groups)

    def count_refused(self, name: Optional[str], reason: str, n: int) -> None:
        """Refusals decided before the queue saw them (a body that failed validation)."""
        reg = self.envs.get(name or "")
        (reg.refused if reg is not None else self.refused_unknown)[reason] += n

    # ---- the manager's side ---------------------------------------------------------------------------
    def quotas(self) -> dict[str, int]:
        return {n: r.groups_per_step for n, r in self.envs.items() if r.groups_per_step}

    def queued(self) -> int:
        return sum(len(r.queue) for r in self.envs.values())

    def drop_stale(self, floor: int) -> int:
        dropped = 0
        for reg in self.envs.values():
            keep = deque(q for q in reg.queue if q.version >= floor)
            n = len(reg.queue) - len(keep)
            if n:
                reg.queue, reg.stale = keep, reg.stale + n
                self._step_stale[reg.name] += n
                dropped += n
        return dropped

    def take_owed(self, owed: dict[str, int], n: int) -> list[Queued]:
        """Up to n groups of the environments this step still waits for (`owed` is decremented)."""
        out: list[Queued] = []
        for name, want in owed.items():
            reg = self.envs.get(name)
            while reg is not None and want > 0 and reg.queue and len(out) < n:
                out.append(reg.queue.popleft())
                want -= 1
            owed[name] = want
        return out

    def take_any(self, n: int) -> list[Queued]:
        """Up to n queued groups of any environment, oldest first."""
        out: list[Queued] = []
        while len(out) < n:
            heads = [r for r in self.envs.values() if r.queue]
            if not heads:
                break
            out.append(min(heads, key=lambda r: r.queue[0].received).queue.popleft())
        return out

    def put_back(self, items: list[Queued]) -> None:
        """Groups of a step that failed go back to the front of their queues, in order."""
        for q in reversed(items):
            if q.environment in self.envs:
                self.envs[q.environment].queue.appendleft(q)

    def trained(self, items: list[Queued]) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[float, float]]]:
        """Count a step's groups as trained. Returns per environment: groups, reward mean, reward
        parts' means and groups dropped as stale since the previous step; and each reward part's
        (mean, std) over all of them."""
        out: dict[str, dict[str, Any]] = {}
        by_env: dict[str, list[Group]] = {}
        every: dict[str, list[float]] = {}
        for q in items:
            by_env.setdefault(q.environment, []).append(q.group)
            if q.environment in self.envs:
                self.envs[q.environment].trained += 1
        for name in sorted(set(by_env) | set(self._step_stale)):
            groups = by_env.get(name, [])
            rewards = [r for g in groups for r in g.rewards or ()]
            parts: dict[str, list[float]] = {}
            for g in groups:
                for k, v in g.reward_parts.items():
                    parts.setdefault(k, []).extend(v)
                    every.setdefault(k, []).extend(v)
            out[name] = {"groups": len(groups), "stale": self._step_stale.get(name, 0),
                         "reward_mean": _mean(rewards), "rewards": {k: _mean(v) for k, v in parts.items() if v}}
        self._step_stale.clear()
        return out, {k: _mean_std(v) for k, v in every.items() if v}

    def waiting_for(self, owed: dict[str, int], need: int, workflow: bool) -> str:
        """What a step that still needs `need` groups waits for, in words."""
        now = time.monotonic()
        parts = []
        for name, n in owed.items():
            if n > 0:
                reg = self.envs.get(name)
                seen = f"last heard {now - reg.last_seen:.0f} s ago" if reg else "not registered"
                parts.append(f"environment '{name}' owes {n} group(s) ({seen})")
        rest = need - sum(owed.values())
        if rest > 0:
            if workflow:
                parts.append(f"{rest} group(s) from the trainer's own workflow")
            else:
                heard = ", ".join(f"'{n}' (last heard {now - r.last_seen:.0f} s ago)" for n, r in self.envs.items())
                parts.append(f"{rest} group(s) from any environment (registered: {heard or 'none'})")
        missing = [n for n in self.expected if n not in self.envs]
        if missing:
            parts.append(f"spec.environments never registered: {', '.join(missing)}")
        return "; ".join(parts) or "nothing"

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        envs = {n: {"groups_per_step": r.groups_per_step, "queued": len(r.queue), "accepted": r.accepted,
                    "trained": r.trained, "stale": r.stale, "refused": dict(r.refused),
                    "last_seen_seconds": round(now - r.last_seen, 3)} for n, r in self.envs.items()}
        refused = Counter(self.refused_unknown)
        for r in self.envs.values():
            refused.update(r.refused)
        return {"environments": envs, "expected": list(self.expected), "queued": self.queued(),
                "queue_limit": self.limit, "accepted": sum(r.accepted for r in self.envs.values()),
                "trained": sum(r.trained for r in self.envs.values()),
                "stale": sum(r.stale for r in self.envs.values()), "refused": dict(refused),
                "reserved_per_step": sum(self.quotas().values())}

    # ---- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"registrations": {n: r.groups_per_step for n, r in self.envs.items()},
                "queued": [{"environment": q.environment, "version": q.version, "group": dataclasses.asdict(q.group)}
                           for r in self.envs.values() for q in r.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, quota in state.get("registrations", {}).items():
            self.envs[name] = Registration(name, quota)
        for item in state.get("queued", ()):
            if item["environment"] in self.envs:
                self.envs[item["environment"]].queue.append(
                    Queued(_group(item["group"]), int(item["version"]), item["environment"]))


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    return m, max(0.0, sum(x * x for x in values) / len(values) - m * m) ** 0.5


def _group(d: dict[str, Any]) -> Group:
    completion = lambda c: Completion(**c) if c is not None else None  # noqa: E731
    return Group(**{**d, "sample": Sample(**d["sample"]), "completions": [completion(c) for c in d["completions"]],
                    "baseline": completion(d.get("baseline"))})
