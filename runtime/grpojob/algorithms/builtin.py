"""The built-in GRPO-family algorithms. Each differs from GRPO only in the choices that define it;
everything else (clip range, KL, importance cap, epochs) comes from the spec."""
from __future__ import annotations

import dataclasses

from torch import Tensor

from grpojob.algorithms.base import Algorithm, Settings, TokenBatch
from grpojob.algorithms.losses import sequence_log_ratio

# DAPO's clip-higher upper bound (Yu et al. 2025), used when the spec leaves the range symmetric.
DAPO_CLIP_HIGH = 0.28


class GRPO(Algorithm):
    """Shao et al. 2024: advantages (r - group mean) / group std, PPO-clipped token ratios.
    Aggregation and normalisation as the spec says."""
    name = "grpo"


class DrGRPO(Algorithm):
    """Liu et al. 2025 ("GRPO done right"): no std division (it biases towards easy/hard
    prompts) and a constant length divisor (no length bias): seq-mean-token-sum-norm."""
    name = "dr_grpo"
    overrides = {"normalization": "none", "aggregation": "seq-mean-token-sum-norm"}


class DAPO(Algorithm):
    """Yu et al. 2025: token-level aggregation, clip-higher (a larger upper clip), dynamic sampling
    (groups with all-equal rewards carry no signal and are dropped). Overlong shaping follows
    spec.algorithm.overlong (filter or penalty) as for every algorithm."""
    name = "dapo"
    overrides = {"aggregation": "token-mean", "dynamic_sampling": True}

    def configure(self, s: Settings) -> Settings:
        s = super().configure(s)
        if s.clip_eps_high <= s.clip_eps_low:
            s = dataclasses.replace(s, clip_eps_high=max(DAPO_CLIP_HIGH, s.clip_eps_low))
        return s


class GSPO(Algorithm):
    """Zheng et al. 2025: the importance ratio and its clipping are per sequence (the geometric
    mean of token ratios), so every token of a sequence shares one ratio; sequence-mean
    aggregation. GSPO's paper clips much tighter than PPO (3e-4 / 4e-4): set clipEpsLow/High."""
    name = "gspo"
    overrides = {"ratio_level": "sequence", "aggregation": "seq-mean-token-mean"}

    def log_ratio(self, b: TokenBatch) -> Tensor:
        return sequence_log_ratio(b.logp, b.old_logp, b.seq_index, b.n_seqs)


class RLOO(Algorithm):
    """Ahmadian et al. 2024: leave-one-out baseline (the mean reward of the other completions of
    the prompt), no std normalisation."""
    name = "rloo"
    overrides = {"baseline": "loo", "normalization": "none"}


class ReinforcePP(Algorithm):
    """Hu 2025 (REINFORCE++ with baseline): group-mean baseline, then whitening over the global
    batch instead of per-group std."""
    name = "reinforce_pp"
    overrides = {"normalization": "batch"}


BUILTINS: dict[str, type[Algorithm]] = {c.name: c for c in (GRPO, DrGRPO, DAPO, GSPO, RLOO, ReinforcePP)}
