"""The built-in datasets and rewards by their spec names, for code outside a job (a Tinker-style
loop, a test) that wants the same task. Imports no torch."""
from __future__ import annotations

from typing import Any, Callable

from grpojob.data.builtin import DATASETS, TOY_CATEGORIES
from grpojob.rewards.builtin import REWARDS

__all__ = ["TOY_CATEGORIES", "builtin_dataset", "builtin_reward"]


def builtin_dataset(name: str) -> Callable[..., Any]:
    """A built-in dataset factory by its spec name (toy, countdown, reasoning-gym): called with dataset.args, it
    yields dict rows."""
    if name not in DATASETS:
        raise KeyError(f"no built-in dataset '{name}': use one of {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def builtin_reward(name: str) -> Callable[..., float]:
    """A built-in reward function by its spec name (math_exact, format, countdown, exact_match,
    toy, reasoning-gym, reasoning-gym-format), in the native signature (prompt, completion, **row) -> float."""
    if name not in REWARDS:
        raise KeyError(f"no built-in reward '{name}': use one of {', '.join(sorted(REWARDS))}")
    return REWARDS[name]
