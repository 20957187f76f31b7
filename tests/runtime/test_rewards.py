"""Built-in rewards on hand-made completions, user rewards (sync and async) by module:function,
weights, and failures that name the reward."""
from __future__ import annotations

import asyncio
import copy
import sys
import types

import pytest

from grpojob.api import parse
from grpojob.api.plugins import BUILTIN_REWARDS
from grpojob.rewards import RewardError, RewardScorer
from grpojob.rewards.builtin import REWARDS, countdown, exact_match, format, math_exact, toy
from grpojob.contracts.rollout import Completion, Group, Sample

from ..api.test_spec import MINIMAL


def test_registry_matches_the_api_names():
    assert set(REWARDS) == set(BUILTIN_REWARDS)


@pytest.mark.parametrize("completion,answer,expected", [
    ("so the answer is \\boxed{42}", "42", 1.0),
    ("\\boxed{\\frac{1}{2}} no", "0.5", 0.0),
    ("work ... #### 1,234", "Natalia sold ... #### 1234", 1.0),
    ("#### 7", "8", 0.0),
    ("the answer is 42", "42", 0.0),  # no final-answer marker
    ("\\boxed{-3.5}", "-3.5", 1.0),
])
def test_math_exact(completion, answer, expected):
    assert math_exact("q", completion, answer=answer) == expected


def test_format():
    assert format("q", "<think>a b</think> the answer is \\boxed{3}") == 1.0
    assert format("q", "<think>a b</think> no answer") == 0.5
    assert format("q", "\\boxed{3}") == 0.5
    assert format("q", "nothing") == 0.0
    assert format("q", "<answer>1</answer>", pattern=r"^<answer>\d+</answer>$") == 1.0


def test_exact_match():
    assert exact_match("q", "  Fox. ", answer="fox") == 1.0
    assert exact_match("q", "fox owl", answer="fox") == 0.0
    assert exact_match("q", "fox owl", answer="fox", prefix=True) == 1.0
    assert exact_match("q", "foxes", answer="fox", prefix=True) == 0.0


@pytest.mark.parametrize("completion,expected", [
    ("<answer> (3 * 4) + 5 </answer>", 1.0),
    ("<answer> 3 * 4 + 5 + 5 </answer>", 0.1),  # 5 used twice
    ("<answer> 3 + 4 + 5 </answer>", 0.1),  # wrong value
    ("<answer> __import__('os') </answer>", 0.0),  # not arithmetic
    ("17", 0.0),
    ("<answer> 3 / 0 </answer>", 0.1),
])
def test_countdown(completion, expected):
    assert countdown("p", completion, numbers=[3, 4, 5], target=17) == expected


def test_toy_is_the_share_of_category_words():
    assert toy("list animals :", " fox owl cat", answer="animals") == 1.0
    assert toy("list animals :", " fox red 12 cat", answer="animals") == 0.5
    assert toy("list numbers :", " 12 7 fox", answer="numbers") == pytest.approx(2 / 3)
    assert toy("list colors :", "", answer="colors") == 0.0


class FakeTokenizer:
    """Stand-in for a tokenizer: ids are characters' code points."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def group_of(texts, row):
    comps = [Completion(prompt_ids=[1], completion_ids=[ord(c) for c in t], logprobs=[0.0] * len(t),
                        policy_version=0) for t in texts]
    return Group(Sample(0, "prompt", [1], row), comps)


def test_scorer_weights_user_rewards_sync_and_async(monkeypatch):
    mod = types.ModuleType("user_rewards_mod")

    def length(prompt, completion, **row):
        return len(completion) / 10

    async def has_answer(prompt, completion, answer=None, bonus=1.0, **row):
        return bonus if answer in completion else 0.0

    mod.length, mod.has_answer = length, has_answer
    monkeypatch.setitem(sys.modules, "user_rewards_mod", mod)
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["rewards"] = [{"name": "user_rewards_mod:length", "weight": 0.5},
                              {"name": "user_rewards_mod:has_answer", "weight": 2.0, "args": {"bonus": 3.0}}]
    scorer = RewardScorer(parse(doc, resolve_plugins=True).spec, FakeTokenizer())
    g = group_of(["xx 42", "no"], {"answer": "42"})
    asyncio.run(scorer.score_group(g))
    assert g.reward_parts == {"length": [0.5, 0.2], "has_answer": [3.0, 0.0]}
    assert g.rewards == pytest.approx([0.5 * 0.5 + 2 * 3.0, 0.5 * 0.2])


def test_workflow_reward_wins():
    scorer = RewardScorer(parse(MINIMAL).spec, FakeTokenizer())
    g = group_of(["\\boxed{1}", "\\boxed{2}"], {"answer": "1"})
    g.completions[1].reward = 0.25
    asyncio.run(scorer.score_group(g))
    assert g.rewards == [1.0, 0.25]


def test_failing_reward_names_itself(monkeypatch):
    mod = types.ModuleType("bad_rewards_mod")
    mod.boom = lambda prompt, completion, **row: 1 / 0
    mod.nan = lambda prompt, completion, **row: float("nan")
    monkeypatch.setitem(sys.modules, "bad_rewards_mod", mod)
    for name, words in (("bad_rewards_mod:boom", "ZeroDivisionError"), ("bad_rewards_mod:nan", "nan")):
        doc = copy.deepcopy(MINIMAL)
        doc["spec"]["rewards"] = [{"name": "math_exact"}, {"name": name}]
        scorer = RewardScorer(parse(doc, resolve_plugins=True).spec, FakeTokenizer())
        with pytest.raises(RewardError, match=rf"spec.rewards\[1\].*{words}"):
            asyncio.run(scorer.score_group(group_of(["x"], {})))


def test_greedy_baseline_completion_is_scored():
    scorer = RewardScorer(parse(MINIMAL).spec, FakeTokenizer())
    g = group_of(["\\boxed{1}", "\\boxed{2}"], {"answer": "2"})
    g.baseline = group_of(["\\boxed{2}"], {}).completions[0]
    asyncio.run(scorer.score_group(g))
    assert g.rewards == [0.0, 1.0] and g.baseline_reward == 1.0
