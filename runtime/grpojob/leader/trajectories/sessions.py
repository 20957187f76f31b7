"""Agent sessions on the trainer leader: the record of every session the rollout servers serve
with `X-Session-Id` (grpojob.rollout.sessions), turned into training groups when they end.

A session's record is one trajectory: the first turn's prompt, then for every turn the context
tokens that came before it (tool results, user messages, the chat template's turn markers: loss
mask 0) and the completion the policy generated (loss mask 1, with its log-probs and the policy
version of each token). A turn that does not extend the record (its prompt is not the record's
tokens followed by more) starts the record over; the earlier turns are dropped (`restarted`).

A reward ends a session (POST .../reward: a number, or none and the job's rewards score it with
the first prompt's text as `prompt`, the last turn's text as `completion`, and the body's `row`
plus `turns`, every turn's text). Ended sessions wait in their group (the `X-Session-Group` of
their first turn, else their first prompt's tokens) until algorithm.groupSize of them are there;
the group is then queued for training as an environment's groups are (under the name of the
first turn's `X-Session-Environment`, default `sessions`), under the same version floor
(grpojob.leader.trajectories.queue). Sessions idle longer than TTL_SECONDS, and groups
not filled in that time, are dropped and counted.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.leader.trajectories import wire
from grpojob.leader.trajectories.queue import Refused

log = logging.getLogger("grpojob.leader.trajectories.sessions")

ENVIRONMENT = "sessions"  # the default environment sessions' groups are queued under
TTL_SECONDS = 1800.0
MAX_OPEN = 4096  # sessions recorded at once
RETRY = ("starting", "full", "unregistered")  # refusals after which a full group waits and is offered again


@dataclass
class Record:
    prompt_ids: list[int]
    group: Optional[str]
    environment: str = ENVIRONMENT
    ids: list[int] = field(default_factory=list)  # everything after the first prompt
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0  # tokens before the last turn's completion
    mode: str = "chat"
    rendered: str = ""
    returned: str = ""
    messages: int = 0
    turns: list[str] = field(default_factory=list)
    finish_reason: str = "stop"
    seen: float = 0.0

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.ids

    def append(self, ids: list[int], trained: bool, logprobs: Optional[list[float]] = None,
               versions: Optional[list[int]] = None) -> None:
        self.ids += ids
        self.mask += [int(trained)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        # context tokens carry the version of the completion before them: a group's version is
        # the oldest of its generated tokens
        self.versions += versions if versions is not None else [self.versions[-1] if self.versions else 0] * len(ids)

    def completion(self) -> Completion:
        generated = [v for v, m in zip(self.versions, self.mask) if m]
        return Completion(prompt_ids=list(self.prompt_ids), completion_ids=list(self.ids), logprobs=list(self.logprobs),
                          policy_version=min(generated), finish_reason=self.finish_reason,
                          text=self.turns[-1] if self.turns else "", loss_mask=list(self.mask),
                          versions=list(self.versions) if len(set(generated)) > 1 else None)


class Sessions:
    """Thread-safe (the leader's request threads). `manager`: the RolloutManager (register,
    submit, run); `scorer`: the job's RewardScorer (None: a reward must be posted)."""

    def __init__(self, manager, limits: wire.Limits, *, scorer=None, tokenizer=None, ttl: float = TTL_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.manager, self.limits, self.scorer, self.tokenizer = manager, limits, scorer, tokenizer
        self.ttl, self.clock = ttl, clock
        self.open: dict[str, Record] = {}
        self.waiting: dict[str, tuple[float, list[tuple[Completion, float, dict[str, float]]]]] = {}
        self.ready: list[tuple[str, Group]] = []  # (environment, a full group)
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._registered: set[str] = set()

    # ---- turns --------------------------------------------------------------------------------------
    def state(self, sid: str) -> Optional[dict[str, Any]]:
        with self._lock:
            self._sweep()
            r = self.open.get(sid)
            if r is None:
                return None
            return {"session": sid, "tokens": r.tokens, "prompt_length": r.prompt_length, "mode": r.mode,
                    "rendered": r.rendered, "returned": r.returned, "messages": r.messages, "turns": len(r.turns)}

    def add_turn(self, sid: str, t: wire.SessionTurnIn) -> dict[str, Any]:
        c = t.completion
        with self._lock:
            self._sweep()
            r = self.open.get(sid)
            extends = r is not None and t.continued and t.prompt_ids[:len(r.tokens)] == r.tokens
            if not extends:
                if r is not None:
                    self.counts["restarted"] += 1
                elif len(self.open) >= MAX_OPEN:
                    raise Refused(429, "full", f"{MAX_OPEN} sessions are open: end some (POST .../reward) first")
                r = self.open[sid] = Record(list(t.prompt_ids), t.group or (r.group if r is not None else None),
                                            t.environment or (r.environment if r is not None else ENVIRONMENT))
            else:
                r.append(t.prompt_ids[len(r.tokens):], trained=False)
            r.prompt_length = len(r.tokens)
            r.append(list(c.token_ids), trained=True, logprobs=list(c.logprobs),
                     versions=list(c.versions) if c.versions else [int(c.policy_version)] * len(c.token_ids))
            r.mode, r.rendered, r.returned, r.messages = t.mode, t.rendered, t.returned, t.messages
            r.turns.append(c.text)
            r.finish_reason, r.seen = c.finish_reason, self.clock()
            return {"session": sid, "turns": len(r.turns), "tokens": len(r.tokens), "restarted": not extends}

    # ---- the end of a session -------------------------------------------------------------------------
    def finish(self, sid: str, body: wire.SessionRewardIn) -> dict[str, Any]:
        with self._lock:
            r = self.open.pop(sid, None)
        if r is None:
            raise Refused(404, "unknown", f"session {sid} has no recorded turn (never served, already ended, or "
                                          f"idle longer than {self.ttl:.0f} s)")
        total = len(r.tokens)
        if total > self.limits.max_sequence_tokens:
            self._count("too_long")
            raise Refused(400, "too_long", f"session {sid} holds {total} tokens, more than training.microBatchTokens "
                                           f"({self.limits.max_sequence_tokens}): it cannot be trained on")
        c = r.completion()
        reward, parts = body.reward, dict(body.reward_parts)
        if reward is None:
            reward, parts = self._score(r, c, body.row)
        c.reward = reward
        key = r.group or "prompt:" + hashlib.sha1(str(r.prompt_ids).encode()).hexdigest()[:16]
        key = f"{r.environment}/{key}"
        with self._lock:
            self.counts["ended"] += 1
            since, members = self.waiting.get(key, (self.clock(), []))
            members.append((c, reward, parts))
            if len(members) < self.limits.group_size:
                self.waiting[key] = (since, members)
            else:
                self.waiting.pop(key, None)
                self.ready.append((r.environment, _group(members, r.environment)))
            have = len(members) % self.limits.group_size or self.limits.group_size
        submitted = self.offer()
        return {"session": sid, "reward": reward, "reward_parts": parts, "group": key, "group_sessions": have,
                "group_size": self.limits.group_size, "submitted": submitted}

    def _score(self, r: Record, c: Completion, row: dict[str, Any]) -> tuple[float, dict[str, float]]:
        if self.scorer is None:
            raise Refused(400, "no_reward", "the body has no reward and the job names no spec.rewards to score "
                                            "the session with")
        prompt = self.tokenizer.decode(r.prompt_ids, skip_special_tokens=False) if self.tokenizer else ""
        g = Group(sample=Sample(index=-1, prompt=prompt, prompt_ids=list(r.prompt_ids),
                                row={**row, "turns": list(r.turns)}), completions=[c])
        try:
            self.manager.run(self.scorer.score_group(g), timeout=120)
        except Exception as e:  # the reward's own error names it (spec.rewards[i])
            raise Refused(400, "reward_failed", f"scoring the session failed: {e}") from None
        return float(g.rewards[0]), {k: float(v[0]) for k, v in g.reward_parts.items() if v}

    def offer(self) -> int:
        """Queue the full groups for training; those the queue cannot take now wait (RETRY)."""
        with self._lock:
            groups, self.ready = self.ready, []
        done, keep = 0, []
        for env, g in groups:
            try:
                if env not in self._registered:
                    self.manager.register(env, None)
                    self._registered.add(env)
                done += self.manager.submit(env, [g])
            except Refused as e:
                if e.reason == "unregistered":  # a trainer restarted without a checkpoint
                    self._registered.discard(env)
                if e.reason in RETRY:
                    keep.append((env, g))
                else:
                    log.warning("a group of sessions was refused (%s): %s", e.reason, e)
                    self._count(f"refused_{e.reason}")
        with self._lock:
            self.ready = keep + self.ready
            self.counts["submitted"] += done
        return done

    # ---- upkeep -------------------------------------------------------------------------------------
    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _sweep(self) -> None:
        """Under the lock: drop idle sessions and groups not filled within the TTL."""
        now = self.clock()
        for sid in [s for s, r in self.open.items() if now - r.seen > self.ttl]:
            del self.open[sid]
            self.counts["expired"] += 1
        for key in [k for k, (since, _) in self.waiting.items() if now - since > self.ttl]:
            self.counts["expired_in_groups"] += len(self.waiting.pop(key)[1])

    def status(self) -> dict[str, Any]:
        self.offer()
        with self._lock:
            self._sweep()
            return {"open": len(self.open), "waiting_groups": {k: len(m) for k, (_, m) in self.waiting.items()},
                    "ready_groups": len(self.ready), "counts": dict(self.counts)}


def _group(members: list[tuple[Completion, float, dict[str, float]]], environment: str) -> Group:
    """A group of ended sessions: each keeps its own prompt (grouped by X-Session-Group, their first
    prompts may differ); reward parts that every session has."""
    first = members[0][0]
    names = set.intersection(*(set(p) for _, _, p in members)) if members else set()
    sample = Sample(index=-1, prompt="", prompt_ids=list(first.prompt_ids), row={"environment": environment})
    return Group(sample=sample,
                 completions=[c for c, _, _ in members], rewards=[r for _, r, _ in members],
                 reward_parts={n: [p[n] for _, _, p in members] for n in sorted(names)})
