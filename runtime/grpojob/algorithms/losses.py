"""Per-token policy-gradient terms, KL estimators and loss aggregation: pure tensor functions.

Token tensors are flat (one entry per trained token, [N]); a `seq_index` tensor ([N], values in
0..S-1) says which sequence each token belongs to. The same functions serve padded tensors
through `flatten_padded`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")

# exp() of a log-ratio above this overflows float32; ratios that large are clipped anyway.
_MAX_LOG_RATIO = 20.0


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL").

    k1 = log r'  (unbiased, high variance, can be negative), with r' = pi/pi_ref
    k2 = (log r')^2 / 2  (biased, low variance)
    k3 = r - 1 - log r with r = pi_ref/pi  (unbiased, always >= 0)"""
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        neg = (-d).clamp(max=_MAX_LOG_RATIO)
        return torch.exp(neg) - 1.0 - neg
    raise ValueError(f"algorithm.klEstimator: unknown estimator '{estimator}' (use {', '.join(KL_ESTIMATORS)})")


def truncated_is_weight(old_logp: Tensor, rollout_logp: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance weight min(pi_old / pi_rollout, cap) per token, and the raw ratio.

    Corrects for samples drawn by a rollout policy that differs from the one being optimised
    (a stale version, or another engine's numerics); constants w.r.t. the gradient."""
    raw = torch.exp((old_logp - rollout_logp).clamp(max=_MAX_LOG_RATIO)).detach()
    return raw.clamp(max=cap), raw


def ppo_clip_loss(log_ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
                  ) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate as a per-token loss: max(-A r, -A clip(r, 1-eps_low, 1+eps_high)).

    Returns (loss, clipped) where `clipped` is 1.0 where the clipped branch is the active one
    (its gradient is zero there)."""
    ratio = torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).to(loss.dtype)


def importance_sampling_loss(log_ratio: Tensor, advantages: Tensor) -> Tensor:
    """REINFORCE with an importance ratio and no clipping, as a per-token loss: -A r with
    r = exp(log_ratio) = pi / q, q the policy that sampled (Tinker's importance_sampling)."""
    return -advantages * torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO))


def cispo_loss(logp: Tensor, log_ratio: Tensor, advantages: Tensor, low: float, high: float
               ) -> tuple[Tensor, Tensor]:
    """CISPO (MiniMax-M1) as a per-token loss: -sg(clip(r, low, high)) * A * log p, r = pi / q
    (Tinker's cispo; low and high are the ratio's bounds, its clip_low/high_threshold). The
    clipped weight is a constant, so every token keeps a gradient (PPO's clip zeroes it).
    Returns (loss, clipped): 1.0 where the ratio was outside [low, high]."""
    ratio = torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO)).detach()
    weight = ratio.clamp(low, high)
    return -weight * advantages * logp, ((ratio < low) | (ratio > high)).to(logp.dtype)


def dro_loss(logp: Tensor, log_ratio: Tensor, advantages: Tensor, beta: float) -> Tensor:
    """Direct Reward Optimization (Richemond et al., 2024) as a per-token loss:
    -(A log p - beta / 2 (log p - log q)^2), q the policy that sampled (Tinker's dro)."""
    return -(advantages * logp - 0.5 * beta * log_ratio * log_ratio)


def nll_loss(logp: Tensor, weights: Tensor) -> Tensor:
    """Weighted negative log-likelihood per token: supervised cross-entropy on chosen targets."""
    return -weights * logp


def segment_sum(values: Tensor, seq_index: Tensor, n_seqs: int) -> Tensor:
    """Sum of `values` per sequence: [N] -> [S]."""
    return torch.zeros(n_seqs, dtype=values.dtype, device=values.device).index_add(0, seq_index, values)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, seq_index: Tensor, n_seqs: int) -> Tensor:
    """GSPO's per-token log-ratio: log s_i + logp_t - sg(logp_t), where log s_i is the mean
    token log-ratio of sequence i (length-normalised sequence likelihood ratio), detached.
    Its value is log s_i at every token; its gradient is that of logp_t scaled by s_i."""
    lengths = segment_sum(torch.ones_like(logp), seq_index, n_seqs).clamp(min=1.0)
    seq = segment_sum((logp - old_logp).detach(), seq_index, n_seqs) / lengths
    return seq[seq_index] + logp - logp.detach()


def token_coefficients(lengths: Tensor, mode: str, n_tokens: float, n_seqs: float, max_tokens: int) -> Tensor:
    """Per-sequence weight of each of its tokens so that sum(coef[seq] * loss_t) over every token of
    the GLOBAL batch is the aggregated loss. `lengths` are this rank's sequences' trained-token
    counts; `n_tokens`/`n_seqs` are global totals (all micro-batches, all ranks).

    token-mean:              sum_t l / n_tokens
    seq-mean-token-mean:     mean over sequences of (sum_t l / len_i)
    seq-mean-token-sum-norm: mean over sequences of (sum_t l / max_tokens)  (Dr. GRPO: a constant
                             divisor, so long and short sequences are not re-weighted)"""
    lengths = lengths.to(torch.float64)
    if mode == "token-mean":
        coef = torch.full_like(lengths, 1.0 / n_tokens) if n_tokens > 0 else torch.zeros_like(lengths)
    elif mode == "seq-mean-token-mean":
        coef = 1.0 / (lengths.clamp(min=1.0) * n_seqs) if n_seqs > 0 else torch.zeros_like(lengths)
    elif mode == "seq-mean-token-sum-norm":
        coef = torch.full_like(lengths, 1.0 / (max_tokens * n_seqs)) if n_seqs > 0 else torch.zeros_like(lengths)
    else:
        raise ValueError(f"algorithm.lossAggregation: unknown mode '{mode}' (use {', '.join(AGGREGATIONS)})")
    return torch.where(lengths > 0, coef, torch.zeros_like(coef)).to(torch.float32)


def aggregate(loss: Tensor, mask: Tensor, mode: str, max_tokens: Optional[int] = None) -> Tensor:
    """Reference aggregation of a padded [B, T] per-token loss with a 0/1 mask on one batch.
    Sequences with no trained token count nowhere; an all-masked batch gives 0, not NaN."""
    mask = mask.to(loss.dtype)
    lengths = mask.sum(-1)
    n_tokens = float(lengths.sum())
    n_seqs = float((lengths > 0).sum())
    coef = token_coefficients(lengths, mode, n_tokens, n_seqs, max_tokens or loss.shape[-1]).to(loss.dtype)
    return (loss * mask * coef[:, None]).sum()


def flatten_padded(mask: Tensor, *tensors: Tensor) -> tuple[Tensor, int, list[Tensor]]:
    """[B, T] tensors with a 0/1 mask -> (seq_index [N], B, the tensors' masked entries [N])."""
    keep = mask.bool()
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)
    return rows[keep], mask.shape[0], [t[keep] for t in tensors]
