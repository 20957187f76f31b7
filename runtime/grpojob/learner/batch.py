"""From scored groups to training sequences: overlong shaping, dynamic sampling, advantages,
global aggregation weights, and the step's reward/length statistics (global over ranks)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from grpojob.algorithms import Algorithm
from grpojob.algorithms.losses import token_coefficients
from grpojob.api.spec import OverlongSpec
from grpojob.algorithms.shaping import shaped_rewards, zero_variance
from grpojob.contracts.rollout import Group
from grpojob.learner.dist import DistEnv, all_max, all_sum, broadcast_object, gather_objects
from grpojob.learner.packing import TrainSeq

log = logging.getLogger("grpojob.trainer")


@dataclass
class Prepared:
    seqs: list[TrainSeq]
    stats: dict[str, float]  # global
    reward_parts: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (mean, std)
    n_tokens: int = 0  # global trained tokens
    n_seqs: int = 0  # global trained sequences
    total_tokens: int = 0  # global prompt+completion tokens of every sampled completion
    extra: dict[str, float] = field(default_factory=dict)  # a trainer plug-in's own numbers (global)


def _mean_std(s: float, ss: float, n: float) -> tuple[Optional[float], Optional[float]]:
    if n <= 0:
        return None, None
    mean = s / n
    var = max(ss / n - mean * mean, 0.0)
    return mean, var ** 0.5


def skips_zero_advantage(algorithm: Algorithm) -> bool:
    """A sequence with advantage 0 adds exactly nothing to the loss or its gradient when the
    algorithm uses the stock per-token loss (A * clipped ratio * IS weight) and there is no KL
    term: such sequences are left out of the forward/backward (they still count in the
    normalisers, so the gradient is identical). Saturated groups are common late in training.
    When nothing is left on any rank, the step makes no update (no learning signal). Entropy and
    clip statistics then describe the trained tokens. (GRPOTrainer.step_training leaves them out,
    after prepare_batch, and only with its stock loss_fn.)"""
    return type(algorithm).policy_loss is Algorithm.policy_loss and algorithm.settings.kl_beta == 0


def part_names(groups: Sequence[Group], reward_names: Sequence[str], env: DistEnv) -> list[str]:
    """The parts the rewards' results carried (`<reward>/<part>`, grpojob.rewards), on any rank: the
    same list everywhere, so that the statistics reduce over the same layout. Collective."""
    own = sorted({k for g in groups for k in g.reward_parts
                  if k not in reward_names and k.split("/", 1)[0] in reward_names})
    if not (env.initialized and env.world > 1):
        return own
    every = gather_objects(own, env)
    return broadcast_object(sorted({k for ks in every for k in ks}) if every is not None else None, env)


Advantages = Callable[[Sequence[Sequence[float]], Optional[Sequence[Optional[float]]]], list[list[float]]]


def prepare(groups: Sequence[Group], algorithm: Algorithm, overlong: OverlongSpec, max_tokens: int,
            policy_version: int, env: DistEnv, reward_names: Sequence[str] = (),
            advantage_fn: Optional[Advantages] = None) -> Prepared:
    """Collective: every rank calls it once per step, even with no groups. `advantage_fn(rewards,
    baselines)` (collective too) defaults to the algorithm's."""
    s = algorithm.settings
    for g in groups:
        if g.rewards is None or len(g.rewards) != len(g.completions):
            raise ValueError(f"sample {g.sample.index}: group has {len(g.completions)} completions but "
                             f"{'no' if g.rewards is None else len(g.rewards)} rewards")
        if not g.sample.prompt_ids:
            raise ValueError(f"sample {g.sample.index}: empty prompt (no tokens)")

    shaped = [shaped_rewards(g, overlong, max_tokens) for g in groups]
    zero_std = [zero_variance(r) for r in shaped]
    keep = [i for i in range(len(groups)) if not (s.dynamic_sampling and zero_std[i])]
    baselines = [groups[i].baseline_reward for i in keep]  # greedy-baseline workflow (ReMax)
    if advantage_fn is None:
        def advantage_fn(rewards, base):
            return algorithm.advantages(rewards, allreduce=lambda t: all_sum(t, env), baselines=base)
    advantages = advantage_fn([shaped[i] for i in keep], baselines if any(b is not None for b in baselines) else None)

    seqs: list[TrainSeq] = []
    for gi, adv in zip(keep, advantages):
        for j, (c, a) in enumerate(zip(groups[gi].completions, adv)):
            mask = list(c.loss_mask) if c.loss_mask is not None else [1] * len(c.completion_ids)
            if overlong.mode == "filter" and c.truncated:
                mask = [0] * len(mask)
            if len(c.logprobs) != len(c.completion_ids) or len(mask) != len(c.completion_ids):
                raise ValueError(f"sample {groups[gi].sample.index}: completion has {len(c.completion_ids)} "
                                 f"tokens, {len(c.logprobs)} log-probs, {len(mask)} loss-mask entries")
            seq = TrainSeq(list(c.prompt_ids) or list(groups[gi].sample.prompt_ids), list(c.completion_ids),
                           mask, list(c.logprobs), float(a), c.policy_version, reward=float(shaped[gi][j]),
                           group=gi)
            if seq.n_trained > 0:
                seqs.append(seq)

    # Global statistics in one all-reduce (sums) and one max.
    comps = [c for g in groups for c in g.completions]
    raw = [r for g in groups for r in g.rewards]
    advs = [x for a in advantages for x in a]
    lengths = [len(c.completion_ids) for c in comps]
    local = [
        len(comps), sum(raw), sum(r * r for r in raw),
        len(advs), sum(advs), sum(a * a for a in advs),
        sum(lengths), sum(c.truncated for c in comps),
        len(groups), sum(zero_std), len(keep),
        sum(policy_version - c.policy_version for c in comps),
        sum(x.n_trained for x in seqs), len(seqs),
        sum(len(c.prompt_ids or g.sample.prompt_ids) + len(c.completion_ids) for g in groups for c in g.completions),
    ]
    reward_names = [*reward_names, *part_names(groups, reward_names, env)]
    for name in reward_names:
        vals = [v for g in groups for v in g.reward_parts.get(name, [])]
        local += [len(vals), sum(vals), sum(v * v for v in vals)]
    tot = all_sum(torch.tensor(local, dtype=torch.float64), env).tolist()
    (n, rs, rss, na, a_s, ass, ls, tr, ng, nz, nk, stale, ntok, nseq, ttok) = tot[:15]
    reward_mean, reward_std = _mean_std(rs, rss, n)
    adv_mean, adv_std = _mean_std(a_s, ass, na)
    version_lag = all_max(torch.tensor([max([policy_version - c.policy_version for c in comps] or [0])],
                                       dtype=torch.float64), env).item()
    stats = {
        "reward_mean": reward_mean, "reward_std": reward_std,
        "advantage_mean": adv_mean, "advantage_std": adv_std,
        "completion_length_mean": ls / n if n else None, "truncated_fraction": tr / n if n else None,
        "zero_std_group_fraction": nz / ng if ng else None,
        "groups": ng, "groups_kept": nk, "completions": n,
        "policy_staleness": stale / n if n else None, "policy_staleness_max": version_lag,
    }
    parts = {}
    for k, name in enumerate(reward_names):
        cnt, s1, s2 = tot[15 + 3 * k: 18 + 3 * k]
        m, sd = _mean_std(s1, s2, cnt)
        if m is not None:
            parts[name] = (m, sd)
    if seqs:
        coefs = token_coefficients(torch.tensor([x.n_trained for x in seqs]), s.aggregation, ntok, nseq,
                                   s.max_tokens)
        for x, c in zip(seqs, coefs.tolist()):
            x.coef = c
    if nk < ng:
        log.info("dynamic sampling dropped %d of %d groups (all-equal rewards)", int(ng - nk), int(ng))
    return Prepared(seqs=seqs, stats=stats, reward_parts=parts, n_tokens=int(ntok), n_seqs=int(nseq),
                    total_tokens=int(ttok))
