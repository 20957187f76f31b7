"""spec.trainer.lossFn: a user's cosmos-rl `loss_fn`, run unchanged as the trainer's loss.

cosmos-rl calls it once per micro-batch as

    loss, per_token_loss, kl_loss = loss_fn(current_token_logps, old_per_token_logps, ref_per_token_logps,
        current_advantages, cu_seqlens, config, logprob_masks, dp_group=, ddp_comm=,
        rollout_per_token_logps=, normalization_counts=)

and so does grpojob, with the micro-batch's tensors in cosmos-rl's layout: the trained tokens flat
[n], sequence after sequence (`cu_seqlens` [bsz + 1] their offsets; `logprob_masks` [bsz, max_len]
True on each sequence's first lengths[i] places), one advantage per token [n], the proximal
log-probs as `old_per_token_logps`, the rollout engine's as `rollout_per_token_logps`, the
reference's (klBeta > 0) or None, `config` the spec under cosmos-rl's names (grpojob.data.config),
`dp_group`/`ddp_comm` None. `normalization_counts` ({"sequences", "tokens": the step's global trained
counts, "dp_workers": 1}) makes cosmos-rl's aggregation the micro-batch's share of the whole step's
loss (the trainer scales by the world size itself), so the returned `loss` is backpropagated as it
is; its `per_token_loss` and `kl_loss` (scalars in cosmos-rl) are reported as extra.cosmos_pg_loss and
extra.cosmos_kl_loss, summed over the step. With lossFn every sequence is trained (none is skipped
for a zero advantage: the stock loss's shortcut need not hold for another loss).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from grpojob.algorithms import LossTerms
from grpojob.api import plugins
from grpojob.api.spec import GRPOJobSpec
from grpojob.data.config import CosmosConfig
from grpojob.learner.errors import TrainerError
from grpojob.learner.packing import MicroBatch

POSITIONAL = ("current_token_logps", "old_per_token_logps", "ref_per_token_logps", "current_advantages",
              "cu_seqlens", "config", "logprob_masks")
KEYWORDS = ("dp_group", "ddp_comm", "rollout_per_token_logps", "normalization_counts")
SHAPE = f"loss_fn({', '.join(POSITIONAL)}, ...) -> (loss, per_token_loss, kl_loss)"


def check_function(fn: Any) -> Optional[str]:
    """Why `fn` cannot be called as cosmos-rl calls a loss_fn, or None."""
    if not callable(fn) or inspect.isclass(fn):
        return f"is not a function (a cosmos-rl {SHAPE} is expected)"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        return f"has a signature that cannot be read ({e})"
    kinds = inspect.Parameter
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    if len(positional) < len(POSITIONAL) and not any(p.kind is kinds.VAR_POSITIONAL for p in params):
        return f"takes {len(positional)} positional arguments; cosmos-rl passes {len(POSITIONAL)}: {SHAPE}"
    required = [p.name for p in params[len(POSITIONAL):] if p.default is p.empty
                and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY) and p.name not in KEYWORDS]
    if required:
        return f"requires {', '.join(required)}, which cosmos-rl's caller does not pass ({', '.join(KEYWORDS)})"
    return None


class CosmosLoss:
    def __init__(self, fn: Callable[..., Any], spec: GRPOJobSpec):
        self.fn, self.config = fn, CosmosConfig(spec)
        params = inspect.signature(fn).parameters.values()
        any_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self.keywords = set(KEYWORDS) if any_kw else {p.name for p in params} & set(KEYWORDS)

    def __call__(self, logp: Tensor, mb: MicroBatch, counts: dict[str, int]) -> tuple[Tensor, LossTerms]:
        ones = torch.ones_like(logp.detach())
        if mb.is_dummy:  # a rank's filler micro-batch: nothing to train, still connected to logp
            zero = (logp * 0).sum()
            return zero, LossTerms(loss=ones * 0, clipped=ones * 0, is_weight=ones, is_raw=ones,
                                   extra={"cosmos_pg_loss": ones * 0, "cosmos_kl_loss": ones * 0})
        d = logp.device
        seq = mb.seq_index.to(d)
        order = torch.argsort(seq, stable=True)  # cosmos-rl's layout: sequence after sequence
        lengths = torch.bincount(seq, minlength=mb.n_seqs)
        cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        masks = torch.arange(int(lengths.max()), device=d)[None, :] < lengths[:, None]
        old, rollout = mb.old_logp.to(d), mb.rollout_logp.to(d).to(logp.dtype)
        ref = mb.ref_logp[order] if mb.ref_logp is not None else None
        kw = {"dp_group": None, "ddp_comm": None, "rollout_per_token_logps": rollout[order],
              "normalization_counts": {"sequences": counts["sequences"], "tokens": counts["tokens"],
                                       "dp_workers": 1}}
        loss, pg, kl = self.fn(logp[order], old[order], ref, mb.advantages.to(d)[order], cu, self.config, masks,
                               **{k: v for k, v in kw.items() if k in self.keywords})
        # token means over the step add up to the sums of these scalars (optimize divides by its tokens)
        scale = counts["tokens"] / logp.numel()
        weight = torch.exp(old - rollout).detach()
        return loss, LossTerms(loss=ones * float(loss.detach()) * scale, clipped=ones * 0, is_weight=weight,
                               is_raw=weight, extra={"cosmos_pg_loss": ones * float(pg) * scale,
                                                     "cosmos_kl_loss": ones * float(kl) * scale})


def build(spec: GRPOJobSpec) -> Optional[CosmosLoss]:
    ref = spec.trainer.loss_fn
    if not ref:
        return None
    try:
        fn = plugins.resolve(ref)
    except (ImportError, AttributeError) as e:
        raise TrainerError(f"spec.trainer.lossFn: {e}") from None
    why = check_function(fn)
    if why:
        raise TrainerError(f"spec.trainer.lossFn: '{ref}' {why}")
    return CosmosLoss(fn, spec)
