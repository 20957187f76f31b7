"""Reward shaping shared by the rollout manager (dynamic sampling) and the trainer (advantages)."""
from __future__ import annotations

from grpojob.api.spec import OverlongSpec
from grpojob.contracts.rollout import Group


def overlong_penalty(length: int, truncated: bool, max_tokens: int, buffer_tokens: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (a non-positive reward term): 0 up to max_tokens - buffer,
    then a linear ramp down to -penalty at max_tokens; a truncated completion gets -penalty."""
    if truncated or length >= max_tokens:
        return -penalty
    start = max_tokens - buffer_tokens
    if buffer_tokens <= 0 or length <= start:
        return 0.0
    return (start - length) / buffer_tokens * penalty


def shaped_rewards(group: Group, overlong: OverlongSpec, max_tokens: int) -> list[float]:
    """The group's rewards as advantages see them (the overlong penalty added when asked)."""
    assert group.rewards is not None, "shaped_rewards needs a scored group"
    if overlong.mode != "penalty":
        return list(group.rewards)
    return [r + overlong_penalty(len(c.completion_ids), c.truncated, max_tokens, overlong.buffer_tokens,
                                 overlong.penalty) for r, c in zip(group.rewards, group.completions)]


def zero_variance(rewards: list[float]) -> bool:
    """All completions scored the same: the group carries no learning signal (DAPO drops it)."""
    return len(set(rewards)) <= 1
