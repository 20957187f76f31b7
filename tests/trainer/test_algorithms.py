"""Losses, aggregation, KL estimators and advantages against hand-computed values."""
import math

import pytest
import torch

from grpojob import algorithms
from grpojob.algorithms import advantages as adv
from grpojob.algorithms.base import Algorithm, TokenBatch
from grpojob.algorithms.losses import (aggregate, flatten_padded, kl_penalty, ppo_clip_loss, segment_sum,
                                       sequence_log_ratio, token_coefficients, truncated_is_weight)
from grpojob.api.plugins import BUILTIN_ALGORITHMS
from grpojob.api.spec import AlgorithmSpec
from grpojob.algorithms.shaping import overlong_penalty

t = torch.tensor


def close(a, b, tol=1e-5):
    assert torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          atol=tol), (a, b)


# ---- KL estimators ---------------------------------------------------------------------------
def test_kl_estimators_by_hand():
    logp, ref = t([-1.0, -2.0]), t([-1.5, -1.0])  # log pi - log pi_ref = [0.5, -1]
    close(kl_penalty(logp, ref, "k1"), [0.5, -1.0])
    close(kl_penalty(logp, ref, "k2"), [0.125, 0.5])
    close(kl_penalty(logp, ref, "k3"), [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1])
    assert (kl_penalty(logp, logp, "k3") == 0).all()
    with pytest.raises(ValueError, match="klEstimator"):
        kl_penalty(logp, ref, "k4")


def test_k3_is_finite_for_huge_log_ratios():
    assert torch.isfinite(kl_penalty(t([0.0]), t([200.0]), "k3")).all()


# ---- importance weights and PPO clipping -----------------------------------------------------
def test_truncated_importance_weight():
    old = t([0.0, 0.0, 0.0])
    rollout = t([0.0, math.log(0.5), math.log(0.1)])  # pi_old / pi_rollout = 1, 2, 10
    w, raw = truncated_is_weight(old, rollout, cap=2.0)
    close(raw, [1.0, 2.0, 10.0])
    close(w, [1.0, 2.0, 2.0])


def test_ppo_clip_by_hand():
    lr = torch.log(t([1.5, 0.5, 1.1, 0.7]))
    a = t([1.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_loss(lr, a, 0.2, 0.2)
    close(loss, [-1.2, -0.5, 1.1, 0.8])
    close(clipped, [1, 0, 0, 1])
    loss, _ = ppo_clip_loss(lr, a, 0.2, 0.28)  # clip-higher moves only the upper bound
    close(loss, [-1.28, -0.5, 1.1, 0.8])


def test_ppo_clip_gradient_is_zero_where_clipped():
    lr = torch.log(t([1.5, 1.0])).requires_grad_()
    loss, _ = ppo_clip_loss(lr, t([1.0, 1.0]), 0.2, 0.2)
    loss.sum().backward()
    close(lr.grad, [0.0, -1.0])  # d(-r)/d(log r) = -r at r = 1


# ---- aggregation -----------------------------------------------------------------------------
LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = t([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # third sequence has no trained token: counts nowhere


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 4) / 3),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),
    ("seq-mean-token-sum-norm", ((1 + 2) / 3 + 4 / 3) / 2),  # divisor max_tokens = 3
])
def test_aggregation_by_hand(mode, expected):
    close(aggregate(LOSS, MASK, mode, max_tokens=3), expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_of_empty_batch_is_zero(mode):
    out = aggregate(LOSS, torch.zeros_like(MASK), mode, max_tokens=3)
    assert out.item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_split_across_micro_batches_and_ranks_matches_whole(mode):
    """Coefficients from GLOBAL counts make any split (micro-batches, ranks) sum to the whole."""
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.4).float()
    mask[2] = 0
    whole = aggregate(loss, mask, mode, max_tokens=5)
    lengths = mask.sum(-1)
    n_tok, n_seq = float(lengths.sum()), float((lengths > 0).sum())
    total = 0.0
    for part in ([0, 1], [2, 3], [4], [5]):  # e.g. rank 0: 2 micro-batches, rank 1: 2 micro-batches
        coef = token_coefficients(lengths[part], mode, n_tok, n_seq, 5)
        total = total + (loss[part] * mask[part] * coef[:, None]).sum()
    close(total, whole)


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="lossAggregation"):
        token_coefficients(t([1.0]), "mean", 1, 1, 1)


# ---- GSPO sequence ratio ---------------------------------------------------------------------
def test_sequence_log_ratio_value_and_gradient():
    logp = t([-1.0, -2.0, -3.0]).requires_grad_()
    old = t([-1.5, -2.0, -2.0])
    seq = t([0, 0, 1])
    lr = sequence_log_ratio(logp, old, seq, 2)
    close(lr, [0.25, 0.25, -1.0])  # mean token log-ratio per sequence
    torch.exp(lr).sum().backward()
    close(logp.grad, [math.exp(0.25), math.exp(0.25), math.exp(-1.0)])  # s_i * d logp_t
    close(segment_sum(t([1.0, 2.0, 3.0]), seq, 2), [3.0, 3.0])


# ---- advantages ------------------------------------------------------------------------------
def test_group_advantages_by_hand():
    std = math.sqrt(1 / 3)  # sample std of [1, 0, 0, 1]
    close(adv.compute([[1, 0, 0, 1]], "mean", "group")[0], [0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], 1e-4)
    close(adv.compute([[1, 0, 0, 1]], "mean", "none")[0], [0.5, -0.5, -0.5, 0.5])
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3
    close(adv.compute([[1, 0, 0, 1]], "loo", "none")[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_batch_normalisation_is_global():
    s = math.sqrt(0.5 / 3)  # sample std of the centred values [.5, -.5, 0, 0]
    whole = adv.compute([[1, 0], [3, 3]], "mean", "batch")
    close(whole[0] + whole[1], [0.5 / s, -0.5 / s, 0, 0], 1e-4)
    # Rank A holds group [1, 0], rank B holds [3, 3] (centred: two zeros): A's all-reduce adds B's sums.
    other = t([2.0, 0.0, 0.0], dtype=torch.float64)
    split = adv.compute([[1, 0]], "mean", "batch", allreduce=lambda x: x + other)
    close(split[0], whole[0])


@pytest.mark.parametrize("norm", ["group", "batch", "none"])
@pytest.mark.parametrize("baseline", ["mean", "loo"])
def test_advantage_edge_cases_are_defined(norm, baseline):
    assert adv.compute([[0.7, 0.7, 0.7]], baseline, norm) == [[0.0, 0.0, 0.0]]  # identical rewards
    assert adv.compute([[0.3]], baseline, norm) == [[0.0]]  # one completion
    assert adv.compute([], baseline, norm) == []  # empty batch after filtering


def test_overlong_penalty_by_hand():
    assert overlong_penalty(6, False, 10, 4, 1.0) == 0.0
    assert overlong_penalty(8, False, 10, 4, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(10, False, 10, 4, 2.0) == pytest.approx(-2.0)
    assert overlong_penalty(3, True, 10, 4, 1.0) == -1.0  # truncated
    assert overlong_penalty(9, False, 10, 0, 1.0) == 0.0


# ---- the algorithms --------------------------------------------------------------------------
def test_registry_matches_builtin_names():
    from grpojob.algorithms.builtin import BUILTINS
    assert tuple(BUILTINS) == BUILTIN_ALGORITHMS
    assert set(algorithms.REGISTRY) >= set(BUILTIN_ALGORITHMS)


class Halved(Algorithm):
    """A user algorithm: GRPO with half the advantage."""
    name = "halved"

    def advantages(self, rewards, allreduce=None):
        return [[a / 2 for a in g] for g in super().advantages(rewards, allreduce)]


def test_user_algorithm_by_module_reference_and_register():
    algo = algorithms.build(AlgorithmSpec(name=f"{__name__}:Halved"), max_tokens=4)
    assert isinstance(algo, Halved)
    grpo = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / sample std of [1, 0]
    close(algo.advantages([[1, 0]])[0], [grpo / 2, -grpo / 2], 1e-4)
    algorithms.register("halved")(Halved)
    assert algorithms.resolve("halved") is Halved
    with pytest.raises(TypeError, match="subclass"):
        algorithms.resolve(f"{__name__}:close")
    with pytest.raises(ImportError, match="no_such_module"):
        algorithms.resolve("no_such_module:X")


def _settings(name, **spec):
    return algorithms.build(AlgorithmSpec(name=name, **spec), max_tokens=16).settings


def test_algorithms_set_their_defining_choices():
    assert _settings("grpo").normalization == "group"
    dr = _settings("dr_grpo")
    assert (dr.normalization, dr.aggregation, dr.max_tokens) == ("none", "seq-mean-token-sum-norm", 16)
    dapo = _settings("dapo")
    assert (dapo.aggregation, dapo.dynamic_sampling, dapo.clip_eps_high) == ("token-mean", True, 0.28)
    assert _settings("dapo", clip_eps_high=0.35).clip_eps_high == 0.35  # an explicit clip-higher wins
    assert _settings("gspo").ratio_level == "sequence"
    assert (_settings("rloo").baseline, _settings("rloo").normalization) == ("loo", "none")
    assert _settings("reinforce_pp").normalization == "batch"


def _batch(logp, old, rollout, a, seq, ref=None):
    return TokenBatch(logp=t(logp), old_logp=t(old), rollout_logp=t(rollout), advantages=t(a),
                      seq_index=t(seq), n_seqs=int(max(seq)) + 1, ref_logp=None if ref is None else t(ref))


def test_policy_loss_applies_truncated_importance_weight():
    algo = algorithms.build(AlgorithmSpec(name="grpo", importance_cap=1.5), max_tokens=4)
    # on-policy w.r.t. pi_old (ratio 1); the rollout policy was 2x less likely on token 0
    terms = algo.policy_loss(_batch([0.0, 0.0], [0.0, 0.0], [math.log(0.5), 0.0], [1.0, -2.0], [0, 0]))
    close(terms.is_raw, [2.0, 1.0])
    close(terms.is_weight, [1.5, 1.0])
    close(terms.loss, [-1.5, 2.0])


def test_policy_loss_adds_kl():
    algo = algorithms.build(AlgorithmSpec(name="grpo", kl_beta=0.1, kl_estimator="k1"), max_tokens=4)
    terms = algo.policy_loss(_batch([-1.0], [-1.0], [-1.0], [0.0], [0], ref=[-1.5]))
    close(terms.kl, [0.5])
    close(terms.loss, [0.05])


def test_gspo_clips_the_whole_sequence():
    algo = algorithms.build(AlgorithmSpec(name="gspo", clip_eps_low=0.1, clip_eps_high=0.1), max_tokens=4)
    # sequence 0: token ratios e^0.4 and e^0 -> sequence ratio e^0.2 = 1.22 > 1.1: both tokens clipped
    terms = algo.policy_loss(_batch([0.4, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0, 0, 1]))
    close(terms.clipped, [1.0, 1.0, 0.0])
    close(terms.loss, [-1.1, -1.1, -1.0])


def test_flatten_padded():
    seq, n, (vals,) = flatten_padded(MASK, LOSS)
    assert n == 3 and seq.tolist() == [0, 0, 1] and vals.tolist() == [1.0, 2.0, 4.0]
