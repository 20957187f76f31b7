"""From scored groups to training sequences: edge cases stay defined, shaping and filtering do
what they say, and leaving zero-advantage sequences out changes nothing."""
import math

import pytest
import torch

from grpojob import algorithms
from grpojob.algorithms import Algorithm
from grpojob.api.spec import AlgorithmSpec, OverlongSpec
from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.learner.batch import prepare, skips_zero_advantage
from grpojob.learner.dist import DistEnv
from grpojob.learner.logprobs import PolicyLogprobs
from grpojob.learner.packing import pack

ENV = DistEnv()


def group(index, rewards, lengths=None, truncated=()):
    lengths = lengths or [3] * len(rewards)
    comps = [Completion(prompt_ids=[5, 6, 7], completion_ids=[10 + j + k for k in range(n)], logprobs=[-1.0] * n,
                        policy_version=0, finish_reason="length" if j in truncated else "stop")
             for j, n in enumerate(lengths)]
    return Group(sample=Sample(index=index, prompt="p", prompt_ids=[5, 6, 7]), completions=comps,
                 rewards=list(rewards), reward_parts={"r": list(rewards)})


def algo(name="grpo", **kw):
    return algorithms.build(AlgorithmSpec(name=name, **kw), max_tokens=4)


def _finite(stats):
    for k, v in stats.items():
        assert v is None or math.isfinite(v), (k, v)


def test_identical_rewards_and_single_completion_give_zero_advantage():
    prep = prepare([group(0, [0.5, 0.5, 0.5]), group(1, [1.0])], algo(), OverlongSpec(), 4, 0, ENV, ["r"])
    _finite(prep.stats)
    assert [s.has_signal for s in prep.seqs] == [False] * 4  # all advantages are 0: nothing to train on
    assert prep.stats["zero_std_group_fraction"] == 1.0
    assert prep.stats["advantage_mean"] == 0.0 and prep.stats["reward_mean"] == pytest.approx(0.625)
    assert prep.n_seqs == 4 and prep.n_tokens == 12  # ...but they count in the normalisers


def test_dynamic_sampling_can_empty_the_batch():
    prep = prepare([group(0, [1.0, 1.0]), group(1, [0.0, 0.0])], algo("dapo"), OverlongSpec(), 4, 0, ENV)
    _finite(prep.stats)
    assert prep.seqs == [] and prep.n_seqs == 0 and prep.stats["groups_kept"] == 0
    assert prep.stats["advantage_mean"] is None


def test_empty_step():
    prep = prepare([], algo(), OverlongSpec(), 4, 0, ENV, ["r"])
    assert prep.seqs == [] and prep.stats["reward_mean"] is None and prep.reward_parts == {}


def test_overlong_filter_and_penalty():
    g = group(0, [1.0, 0.0, 0.2], lengths=[2, 4, 3], truncated=(1,))
    filtered = prepare([g], algo(), OverlongSpec(mode="filter"), 4, 0, ENV)
    assert sorted(len(s.completion_ids) for s in filtered.seqs) == [2, 3]  # truncated one: no loss tokens
    assert filtered.stats["truncated_fraction"] == pytest.approx(1 / 3)
    # penalty: buffer 2 before maxTokens 4; length 3 -> -0.5, truncated -> -1
    pen = prepare([group(0, [1.0, 0.0, 0.9], lengths=[2, 4, 3], truncated=(1,))], algo("grpo",
                  advantage_normalization="none"), OverlongSpec(mode="penalty", buffer_tokens=2), 4, 0, ENV)
    shaped = [1.0, -1.0, 0.4]
    mean = sum(shaped) / 3
    assert sorted(s.advantage for s in pen.seqs) == pytest.approx(sorted(r - mean for r in shaped))
    assert pen.stats["reward_mean"] == pytest.approx(1.9 / 3)  # reported rewards are the scorer's


def test_bad_group_is_named():
    g = group(7, [1.0, 0.0])
    g.rewards = [1.0]
    with pytest.raises(ValueError, match="sample 7"):
        prepare([g], algo(), OverlongSpec(), 4, 0, ENV)


def test_staleness_is_measured():
    g = group(0, [1.0, 0.0])
    g.completions[0].policy_version = 3
    prep = prepare([g], algo(), OverlongSpec(), 4, policy_version=5, env=ENV)
    assert prep.stats["policy_staleness"] == pytest.approx((2 + 5) / 2) and prep.stats["policy_staleness_max"] == 5


class NoSkip(Algorithm):
    """GRPO with an overridden (identical) loss: the trainer must not skip anything for it."""

    def policy_loss(self, b):
        return super().policy_loss(b)


def test_leaving_out_zero_advantage_sequences_is_exact(tiny_dir):
    from transformers import AutoModelForCausalLM

    def groups():
        return [group(0, [1.0, 0.0, 0.5], lengths=[2, 4, 3]), group(1, [0.2, 0.2, 0.2]),
                group(2, [0.0, 1.0, 1.0], lengths=[1, 2, 4])]
    fast, full = algo(), NoSkip(AlgorithmSpec(), max_tokens=4)
    assert skips_zero_advantage(fast) and not skips_zero_advantage(full)
    assert not skips_zero_advantage(algo(kl_beta=0.1))
    a = prepare(groups(), fast, OverlongSpec(), 4, 0, ENV)
    a.seqs = [s for s in a.seqs if s.has_signal]  # what GRPOTrainer.step_training does for `fast`
    b = prepare(groups(), full, OverlongSpec(), 4, 0, ENV)
    assert len(a.seqs) == 5 and len(b.seqs) == 9  # group 1 and the 0.5 of group 0 have advantage 0

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    policy = PolicyLogprobs(model)

    def grads(prep, algorithm):
        model.zero_grad()
        for mb in pack(prep.seqs, 256):
            logp, _ = policy(mb.input_ids, mb.position_ids, mb.attention_mask, mb.token_index, mb.targets)
            terms = algorithm.policy_loss(algorithms.TokenBatch(
                logp=logp, old_logp=logp.detach(), rollout_logp=mb.rollout_logp, advantages=mb.advantages,
                seq_index=mb.seq_index, n_seqs=mb.n_seqs))
            (terms.loss * mb.coef).sum().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    ga, gb = grads(a, fast), grads(b, full)
    assert any(g.abs().sum() > 0 for g in ga.values())
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], atol=1e-7, rtol=1e-5, msg=k)
