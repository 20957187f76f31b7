"""pass@k (Chen et al. 2021) and the evaluation's summary, against hand computations."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest

from grpojob.leader.evaluation import pass_at_k, summarise
from grpojob.contracts.rollout import Completion, Group, Sample


@pytest.mark.parametrize("n, c, k, want", [
    (5, 2, 2, 1 - Fraction(3, 10)),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 1, Fraction(1, 4)),  # pass@1 is the share that passes
    (10, 0, 3, Fraction(0)),  # nothing passes
    (3, 3, 3, Fraction(1)),
    (5, 4, 2, Fraction(1)),  # n - c < k: every draw of 2 holds a pass
    (6, 2, 3, 1 - Fraction(4, 20)),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
])
def test_pass_at_k_matches_the_hand_computation(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(float(want), abs=1e-12)


def test_pass_at_k_is_stable_where_the_binomials_are_huge():
    n, c, k = 1000, 7, 400  # C(1000, 400) has about 290 digits: no float holds it
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _group(index: int, rewards: list[float], parts: dict[str, list[float]], lengths: list[int]) -> Group:
    comps = [Completion(prompt_ids=[1], completion_ids=[2] * n, logprobs=[-1.0] * n, policy_version=3,
                        finish_reason="length" if n == 4 else "stop") for n in lengths]
    return Group(sample=Sample(index=index, prompt="p", prompt_ids=[1]), completions=comps, rewards=rewards,
                 reward_parts=parts)


def test_summary_of_two_prompts():
    groups = [_group(0, [1.0, 0.0, 1.5, 0.5], {"a": [1.0, 0.0, 1.0, 0.0], "b": [0.0, 0.0, 0.5, 0.5]}, [4, 2, 2, 4]),
              _group(1, [0.0, 0.0, 0.0, 1.0], {"a": [0.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0]}, [1, 1, 1, 1])]
    rec = summarise(groups, step=7, version=7, threshold=1.0, ks=[1, 2, 4], samples_per_prompt=4, seconds=1.5)
    # prompt 0: 2 of 4 pass; prompt 1: 1 of 4
    assert rec.pass_at["1"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert rec.pass_at["2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)  # 1 - C(2,2)/C(4,2), 1 - C(3,2)/C(4,2)
    assert rec.pass_at["4"] == pytest.approx(1.0)
    assert rec.reward_mean == pytest.approx(4.0 / 8)
    assert rec.reward_std == pytest.approx((sum(r * r for r in (1, 0, 1.5, .5, 0, 0, 0, 1)) / 8 - 0.25) ** 0.5)
    assert rec.rewards == {"a": pytest.approx(3 / 8), "b": pytest.approx(1 / 8)}
    assert rec.completion_length_mean == pytest.approx(16 / 8) and rec.truncated_fraction == pytest.approx(2 / 8)
    assert (rec.step, rec.policy_version, rec.prompts, rec.greedy) == (7, 7, 2, False)
    doc = rec.to_json()
    assert doc["kind"] == "evaluation" and doc["pass_at"] == rec.pass_at
    assert rec.scalars()["eval/pass_at_2"] == rec.pass_at["2"] and rec.scalars()["eval/rewards/a"] == rec.rewards["a"]


def test_greedy_summary_reports_the_pass_rate_as_pass_at_1():
    groups = [_group(i, [r], {"a": [r]}, [2]) for i, r in enumerate([1.0, 0.2, 1.0])]
    rec = summarise(groups, step=0, version=0, threshold=1.0, ks=[1], samples_per_prompt=1)
    assert rec.greedy and rec.pass_at == {"1": pytest.approx(2 / 3)}
