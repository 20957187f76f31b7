"""What one evaluation found: pass@k (the unbiased estimator of Chen et al. 2021) and the record
that metrics.jsonl, /status, Prometheus and the trackers are fed from. Pure Python (no torch)."""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from grpojob.contracts.rollout import Group

KIND = "evaluation"  # metrics.jsonl: the `kind` of an evaluation's row (training steps' rows have none)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k completions drawn without replacement from n, c of which
    pass, passes: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code", eq. 1). Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i): no huge binomials."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:  # every draw of k holds a passing completion
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class EvalRecord:
    """One evaluation of the policy of `step` (0: the initial policy) on the held-out prompts."""
    step: int
    policy_version: int
    prompts: int
    samples_per_prompt: int
    greedy: bool
    pass_threshold: float
    reward_mean: Optional[float] = None  # the weighted sum of spec.rewards, over every completion
    reward_std: Optional[float] = None
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function
    pass_at: dict[str, float] = field(default_factory=dict)  # "k" -> pass@k, averaged over prompts
    completion_length_mean: Optional[float] = None
    truncated_fraction: Optional[float] = None
    seconds: float = 0.0  # generation and scoring, wall time
    time: float = field(default_factory=time.time)
    kind: str = KIND

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scalars(self) -> dict[str, float]:
        """Its numbers under `eval/...` names, for the trackers (logged at `step`)."""
        out = {f"eval/{k}": float(v) for k, v in (("reward_mean", self.reward_mean), ("reward_std", self.reward_std),
                                                   ("completion_length_mean", self.completion_length_mean),
                                                   ("truncated_fraction", self.truncated_fraction),
                                                   ("seconds", self.seconds)) if v is not None}
        out.update({f"eval/rewards/{k}": v for k, v in self.rewards.items()})
        out.update({f"eval/pass_at_{k}": v for k, v in self.pass_at.items()})
        return out

    def status_fields(self) -> dict[str, Any]:
        """The fields of grpojob.api.status.EvaluationStatus."""
        finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time))
        return {"step": self.step, "policy_version": self.policy_version, "prompts": self.prompts,
                "samples_per_prompt": self.samples_per_prompt, "reward_mean": self.reward_mean,
                "rewards": dict(self.rewards), "pass_at": dict(self.pass_at), "time": finished}


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def summarise(groups: list[Group], *, step: int, version: int, threshold: float, ks: list[int],
              samples_per_prompt: int, seconds: float = 0.0) -> EvalRecord:
    """The record of scored groups (one per held-out prompt). A completion passes when its reward
    (the weighted sum) is >= threshold; pass@k is estimated per prompt from its own n completions
    and c passes, then averaged over prompts (prompts with fewer than k completions are left out)."""
    rewards = [r for g in groups for r in g.rewards or ()]
    comps = [c for g in groups for c in g.completions]
    parts: dict[str, list[float]] = {}
    for g in groups:
        for name, values in g.reward_parts.items():
            parts.setdefault(name, []).extend(values)
    pass_at = {}
    for k in ks:
        per_prompt = [pass_at_k(len(g.rewards), sum(r >= threshold for r in g.rewards), k)
                      for g in groups if g.rewards and len(g.rewards) >= k]
        if per_prompt:
            pass_at[str(k)] = sum(per_prompt) / len(per_prompt)
    mean = _mean(rewards)
    std = None if mean is None else max(0.0, sum(r * r for r in rewards) / len(rewards) - mean * mean) ** 0.5
    return EvalRecord(step=step, policy_version=version, prompts=len(groups), samples_per_prompt=samples_per_prompt,
                      greedy=samples_per_prompt == 1, pass_threshold=threshold, reward_mean=mean, reward_std=std,
                      rewards={k: m for k, v in parts.items() if (m := _mean(v)) is not None}, pass_at=pass_at,
                      completion_length_mean=_mean([float(len(c.completion_ids)) for c in comps]),
                      truncated_fraction=_mean([float(c.truncated) for c in comps]), seconds=seconds)
