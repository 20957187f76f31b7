"""Reward scoring: built-ins by name, user functions by `module:function`, sync or async.

A reward function has the signature (prompt, completion, **row) -> float, where `row` holds every
field of the dataset row (answer, numbers, ...). Rewards are summed with their weights.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from typing import Any, Awaitable, Callable, Optional, Union

from ..api import plugins
from ..api.spec import GRPOJobSpec, RewardSpec
from ..rollout.types import Group
from .builtin import REWARDS

log = logging.getLogger("grpojob.rewards")

RewardFn = Callable[..., Union[float, Awaitable[float]]]


class RewardError(RuntimeError):
    pass


def check_function(fn) -> Optional[str]:
    return None if callable(fn) else "is not callable (a function (prompt, completion, **row) -> float is expected)"


def resolve(spec: RewardSpec) -> RewardFn:
    fn = REWARDS[spec.name] if spec.name in REWARDS else plugins.resolve(spec.name)
    if not callable(fn):
        raise RewardError(f"reward '{spec.name}' is not callable")
    return functools.partial(fn, **spec.args) if spec.args else fn


class RewardScorer:
    """Fills Group.rewards (weighted sum per completion) and Group.reward_parts (per reward name)."""

    def __init__(self, spec: GRPOJobSpec, tokenizer: Any):
        self.tokenizer = tokenizer
        self.specs = list(spec.rewards)
        self.fns = [resolve(r) for r in self.specs]
        self.names = reward_names(spec)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def _call(self, i: int, fn: RewardFn, prompt: str, text: str, row: dict[str, Any]) -> float:
        try:
            value = fn(prompt, text, **row)
            if inspect.isawaitable(value):
                value = await value
            value = float(value)
        except Exception as e:  # a user's reward failing must name itself
            raise RewardError(f"reward '{self.specs[i].name}' (spec.rewards[{i}]) failed: "
                              f"{type(e).__name__}: {e}") from e
        if not math.isfinite(value):
            raise RewardError(f"reward '{self.specs[i].name}' (spec.rewards[{i}]) returned {value}")
        return value

    async def score_group(self, group: Group) -> None:
        row = {k: v for k, v in group.sample.row.items() if k not in ("prompt", "completion")}
        texts = [c.text or self.decode(c.completion_ids) for c in group.completions]
        parts = {}
        for i, (fn, name) in enumerate(zip(self.fns, self.names)):
            parts[name] = list(await asyncio.gather(
                *(self._call(i, fn, group.sample.prompt, t, row) for t in texts)))
        total = []
        for j, c in enumerate(group.completions):
            if c.reward is not None:  # a workflow that scores its own trajectories wins
                total.append(float(c.reward))
            else:
                total.append(sum(r.weight * parts[n][j] for r, n in zip(self.specs, self.names)))
        group.rewards, group.reward_parts = total, parts
        if group.baseline is not None:  # greedy-baseline workflow (ReMax): its reward is the baseline
            text = group.baseline.text or self.decode(group.baseline.completion_ids)
            values = [await self._call(i, fn, group.sample.prompt, text, row) for i, fn in enumerate(self.fns)]
            group.baseline_reward = sum(r.weight * v for r, v in zip(self.specs, values))


def reward_names(spec: GRPOJobSpec) -> list[str]:
    """One metric name per reward function: its name (the attribute of a 'module:function'),
    numbered when the same function appears twice."""
    names, seen = [], {}
    for r in spec.rewards:
        base = r.name.split(":")[-1]
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names
