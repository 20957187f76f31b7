"""Advantages from the rewards of each group: pure functions.

`allreduce` (sum over data-parallel ranks, identity by default) makes "batch" statistics global,
so every rank normalises with the same numbers whatever the world size.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

NORMALIZATIONS = ("group", "batch", "none")
BASELINES = ("mean", "loo")
EPS = 1e-6

AllReduce = Callable[[Tensor], Tensor]


def _identity(t: Tensor) -> Tensor:
    return t


def centred(rewards: Sequence[float], baseline: str) -> Tensor:
    """r - baseline for one group. mean: the group mean; loo: the mean of the OTHER completions
    (RLOO; equals G/(G-1) * (r - mean)). A group of one has no baseline to compare with: 0."""
    r = torch.tensor(list(rewards), dtype=torch.float64)
    n = r.numel()
    if n <= 1 or bool((r == r[0]).all()):  # exactly 0, not rounding noise blown up by 1/eps
        return torch.zeros_like(r)
    if baseline == "mean":
        return r - r.mean()
    if baseline == "loo":
        return (r - r.mean()) * (n / (n - 1))
    raise ValueError(f"unknown advantage baseline '{baseline}' (use {', '.join(BASELINES)})")


def group_std(rewards: Sequence[float]) -> float:
    """Sample standard deviation of a group's rewards (0 for a group of one)."""
    r = torch.tensor(list(rewards), dtype=torch.float64)
    return float(r.std()) if r.numel() > 1 else 0.0


def compute(groups: Sequence[Sequence[float]], baseline: str = "mean", normalization: str = "group",
            allreduce: Optional[AllReduce] = None, eps: float = EPS,
            external: Optional[Sequence[Optional[float]]] = None) -> list[list[float]]:
    """Advantages, one list per group.

    group: (r - baseline) / (std of the group + eps)  (GRPO)
    batch: (c - mean(c)) / (std(c) + eps) with c = r - baseline over every completion of the
           GLOBAL batch (REINFORCE++-style whitening; mean(c) is 0 for the built-in baselines)
    none:  r - baseline  (Dr. GRPO, RLOO)
    Groups whose rewards are all equal get advantage 0 in every mode (never NaN).

    external: per group, a baseline reward measured outside the group (the greedy-baseline
    workflow's greedy completion, ReMax) or None; where given it replaces the group baseline,
    so equal rewards can still differ from it, and a group std of 0 leaves r - b unscaled."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"algorithm.advantageNormalization: unknown '{normalization}' "
                         f"(use {', '.join(NORMALIZATIONS)})")
    external = list(external) if external is not None else [None] * len(groups)
    cents = [centred(g, baseline) if b is None else torch.tensor(list(g), dtype=torch.float64) - b
             for g, b in zip(groups, external)]
    if normalization == "group":
        return [(c / (std + eps) if (std := group_std(g)) > 0 or b is None else c).tolist()
                for c, g, b in zip(cents, groups, external)]
    if normalization == "none":
        return [c.tolist() for c in cents]
    allreduce = allreduce or _identity
    flat = torch.cat(cents) if cents else torch.zeros(0, dtype=torch.float64)
    stats = allreduce(torch.tensor([float(flat.numel()), float(flat.sum()), float((flat * flat).sum())],
                                   dtype=torch.float64))
    n, s, ss = (float(x) for x in stats)
    if n <= 1:
        return [torch.zeros_like(c).tolist() for c in cents]
    mean = s / n
    std = max((ss - n * mean * mean) / (n - 1), 0.0) ** 0.5
    return [((c - mean) / (std + eps)).tolist() for c in cents]
