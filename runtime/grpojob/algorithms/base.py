"""The Algorithm interface: how advantages are made and how a token's loss is computed.

An algorithm resolves the spec into `Settings` (its defining choices may override spec fields,
and say so in the log), turns group rewards into advantages, and gives the per-token loss of a
`TokenBatch`. The trainer owns everything else (aggregation weights, micro-batches, ranks).
Users subclass `Algorithm` and name it in the spec as 'module:Class'.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional, Sequence

from torch import Tensor

from grpojob.api.spec import AlgorithmSpec
from grpojob.algorithms import advantages as adv_fns
from grpojob.algorithms.losses import kl_penalty, ppo_clip_loss, truncated_is_weight

log = logging.getLogger("grpojob.algorithms")


@dataclass(frozen=True)
class Settings:
    """Everything the loss and advantage code reads, after the algorithm's own choices."""
    baseline: str = "mean"  # mean | loo
    normalization: str = "group"  # group | batch | none
    aggregation: str = "token-mean"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    ratio_level: str = "token"  # token | sequence (GSPO)
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    importance_cap: float = 2.0
    dynamic_sampling: bool = False
    max_tokens: int = 256  # divisor of seq-mean-token-sum-norm

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, max_tokens: int) -> "Settings":
        return cls(normalization=spec.advantage_normalization, aggregation=spec.loss_aggregation,
                   clip_eps_low=spec.clip_eps_low, clip_eps_high=spec.clip_eps_high, kl_beta=spec.kl_beta,
                   kl_estimator=spec.kl_estimator, importance_cap=spec.importance_cap,
                   dynamic_sampling=spec.dynamic_sampling, max_tokens=max_tokens)


@dataclass
class TokenBatch:
    """Flat per-token tensors of the trained tokens of some sequences ([N] each)."""
    logp: Tensor  # current policy, with gradient
    old_logp: Tensor  # pi_old: the policy at the start of this step's optimisation, detached
    rollout_logp: Tensor  # the rollout engine's log-probs (the policy that sampled)
    advantages: Tensor
    seq_index: Tensor  # sequence of each token, 0..n_seqs-1
    n_seqs: int
    ref_logp: Optional[Tensor] = None  # frozen reference policy, when kl_beta > 0


@dataclass
class LossTerms:
    loss: Tensor  # [N] per-token loss (importance-weighted policy term + beta * KL)
    clipped: Tensor  # [N] 1.0 where the clip was active
    is_weight: Tensor  # [N] truncated importance weight
    is_raw: Tensor  # [N] importance ratio before truncation
    kl: Optional[Tensor] = None  # [N]
    # A custom loss's own per-token numbers [N], reported as their token mean (StepRecord.extra).
    extra: dict[str, Tensor] = field(default_factory=dict)


class Algorithm:
    """GRPO: group-mean baseline, PPO-clipped token ratios, truncated importance correction."""
    name = "grpo"
    overrides: dict = {}  # Settings fields this algorithm fixes whatever the spec says

    def __init__(self, spec: AlgorithmSpec, max_tokens: int):
        self.settings = self.configure(Settings.from_spec(spec, max_tokens))

    def configure(self, s: Settings) -> Settings:
        changed = {k: v for k, v in self.overrides.items() if getattr(s, k) != v}
        if changed:
            log.info("algorithm %s sets %s", self.name, changed)
        return dataclasses.replace(s, **self.overrides)

    def advantages(self, rewards: Sequence[Sequence[float]], allreduce=None,
                   baselines: Optional[Sequence[Optional[float]]] = None) -> list[list[float]]:
        s = self.settings
        return adv_fns.compute(rewards, s.baseline, s.normalization, allreduce, external=baselines)

    def log_ratio(self, b: TokenBatch) -> Tensor:
        return b.logp - b.old_logp

    def policy_loss(self, b: TokenBatch) -> LossTerms:
        s = self.settings
        weight, raw = truncated_is_weight(b.old_logp, b.rollout_logp, s.importance_cap)
        pg, clipped = ppo_clip_loss(self.log_ratio(b), b.advantages, s.clip_eps_low, s.clip_eps_high)
        loss = weight * pg
        kl = None
        if s.kl_beta > 0:
            if b.ref_logp is None:
                raise ValueError("kl_beta > 0 needs reference log-probs")
            kl = kl_penalty(b.logp, b.ref_logp, s.kl_estimator)
            loss = loss + s.kl_beta * kl
        return LossTerms(loss=loss, clipped=clipped, is_weight=weight, is_raw=raw, kl=kl)
