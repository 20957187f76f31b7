"""Reward functions are called in the meaning their authors wrote: grpojob's native form, cosmos-rl's
(to_be_evaluated, reference, ...) and TRL's batched (prompts, completions, **kwargs), recognised by
parameter names or declared in spec.rewards[i].signature; a signature that cannot be honoured is
refused at validation with its field path."""
from __future__ import annotations

import asyncio
import copy
import sys
import textwrap
import types

import pytest

from grpojob.api import parse
from grpojob.api.validate import check
from grpojob.cli import main as cli
from grpojob.rewards import RewardScorer
from grpojob.contracts.rollout import Completion, Group, Sample

from ..api.test_spec import MINIMAL
from .test_rewards import FakeTokenizer

PROMPT = "name the answer :"  # no completion below contains it, and it contains no MARK
TEXTS = ["MARK one", "two", "three MARK"]  # only completions carry the marker


def scorer_for(rewards, monkeypatch, dataset=None, **functions):
    mod = types.ModuleType("form_rewards")
    for name, fn in functions.items():
        setattr(mod, name, fn)
    monkeypatch.setitem(sys.modules, "form_rewards", mod)
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["rewards"] = rewards
    if dataset:
        doc["spec"]["dataset"].update(dataset)
    return RewardScorer(parse(doc, resolve_plugins=True).spec, FakeTokenizer())


def group(texts=TEXTS, row=None):
    comps = [Completion(prompt_ids=[1], completion_ids=[ord(c) for c in t], logprobs=[0.0] * len(t),
                        policy_version=0) for t in texts]
    return Group(Sample(0, PROMPT, [1], row if row is not None else {"prompt": PROMPT, "answer": "42"}), comps)


def scored(scorer, g=None):
    g = g or group()
    asyncio.run(scorer.score_group(g))
    return g


def native(prompt, completion, **row):
    return float("MARK" in completion)


def native_reordered(completion, prompt, answer):  # names, not positions, say which is which
    return float("MARK" in completion and prompt == PROMPT and answer == "42")


def cosmos(to_be_evaluated, reference, *args, **kwargs):  # cosmos-rl's custom reward, as its docs write it
    return float("MARK" in to_be_evaluated and reference == "42" and kwargs["prompt"] == PROMPT
                 and kwargs["tokenizer"] is not None)


def cosmos_own_names(response, ground_truth, *args, **kwargs):  # cosmos-rl passes these two by position
    return float("MARK" in response and ground_truth == "42")


def trl(prompts, completions, **kwargs):
    return [float("MARK" in c) for c in completions]


async def trl_async(prompts, completions, answer, **kwargs):
    return [float("MARK" in c and a == "42") for c, a in zip(completions, answer)]


@pytest.mark.parametrize("reward,fn", [
    ({"name": "form_rewards:fn"}, native),
    ({"name": "form_rewards:fn"}, native_reordered),
    ({"name": "form_rewards:fn", "signature": "native"}, lambda p, c, **row: float("MARK" in c)),
    ({"name": "form_rewards:fn"}, cosmos),
    ({"name": "form_rewards:fn", "signature": "cosmos"}, cosmos),
    ({"name": "form_rewards:fn", "signature": "cosmos"}, cosmos_own_names),
    ({"name": "form_rewards:fn"}, trl),
    ({"name": "form_rewards:fn", "signature": "trl"}, trl_async),
], ids=["native", "native-by-name", "native-declared", "cosmos", "cosmos-declared", "cosmos-own-names",
        "trl", "trl-async"])
def test_each_form_scores_the_completion_not_the_prompt(reward, fn, monkeypatch):
    g = scored(scorer_for([reward], monkeypatch, fn=fn))
    assert g.rewards == [1.0, 0.0, 1.0]
    assert g.reward_parts == {"fn": [1.0, 0.0, 1.0]}


def test_trl_gets_lists_aligned_with_the_completions_and_its_list_maps_back(monkeypatch):
    seen = {}

    def by_length(prompts, completions, completion_ids, answer, trainer_state=None, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, answer=answer, kwargs=kwargs)
        return [float(len(ids)) for ids in completion_ids]  # one distinct value per completion

    texts = ["a", "bbbb", "cc"]
    scorer = scorer_for([{"name": "form_rewards:by_length", "weight": 0.5}], monkeypatch, by_length=by_length)
    g = scored(scorer, group(texts, {"prompt": PROMPT, "answer": "42", "level": 3}))
    assert g.rewards == [0.5, 2.0, 1.0]  # in the completions' order
    assert seen["completions"] == texts and seen["ids"] == [[ord(c) for c in t] for t in texts]
    assert seen["prompts"] == [PROMPT] * 3 and seen["answer"] == ["42"] * 3
    assert seen["kwargs"] == {"level": [3, 3, 3]}  # the row's other columns, one entry per completion


def test_trl_conversational_prompts_get_message_completions(monkeypatch):
    messages = [{"role": "user", "content": PROMPT}]
    seen = {}

    def chat(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions)
        return [float("MARK" in c[0]["content"]) for c in completions]

    scorer = scorer_for([{"name": "form_rewards:chat"}], monkeypatch, {"messagesField": "messages"}, chat=chat)
    g = scored(scorer, group(row={"messages": messages, "answer": "42"}))
    assert g.rewards == [1.0, 0.0, 1.0]
    assert seen["prompts"] == [messages] * 3
    assert seen["completions"][0] == [{"role": "assistant", "content": TEXTS[0]}]


def test_trl_none_means_not_scored(monkeypatch):
    def some(prompts, completions, **kwargs):
        return [None if c == "two" else 2.0 for c in completions]

    scorer = scorer_for([{"name": "form_rewards:some"}, {"name": "form_rewards:native", "weight": 3.0}],
                        monkeypatch, some=some, native=native)
    g = scored(scorer)
    assert g.rewards == [5.0, 0.0, 5.0]  # the unscored term is left out of the sum (TRL's nansum)
    assert g.reward_parts == {"some": [2.0, 2.0], "native": [1.0, 0.0, 1.0]}


@pytest.mark.parametrize("out", [[1.0], 1.0, "11"])
def test_trl_returning_the_wrong_shape_names_itself(out, monkeypatch):
    scorer = scorer_for([{"name": "form_rewards:short"}], monkeypatch, short=lambda prompts, completions, **k: out)
    with pytest.raises(Exception, match=r"spec.rewards\[0\].*a trl reward returns a list of 3"):
        scored(scorer)


def test_a_native_reward_returning_none_names_itself(monkeypatch):
    scorer = scorer_for([{"name": "form_rewards:nothing"}], monkeypatch, nothing=lambda prompt, completion: None)
    with pytest.raises(Exception, match=r"spec.rewards\[0\].*returned None"):
        scored(scorer)


BAD = '''
    def positional(text, ref):
        return 1.0

    def two_forms(completion, completions):
        return 1.0

    def needs_config(to_be_evaluated, reference, data_packer, **kwargs):
        return 1.0

    def fixed(prompt, completion):
        return 1.0
'''


def test_grpojob_validate_refuses_signatures_it_cannot_honour(tmp_path, capsys):
    (tmp_path / "bad_rewards.py").write_text(textwrap.dedent(BAD))
    ref = f"{tmp_path}/bad_rewards.py"
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f'''
        apiVersion: grpojob.io/v1alpha1
        kind: GRPOJob
        metadata: {{name: p}}
        spec:
          model: {{path: /m}}
          dataset: {{factory: toy}}
          rewards:
            - {{name: toy}}
            - {{name: "{ref}:positional"}}
            - {{name: "{ref}:two_forms"}}
            - {{name: "{ref}:needs_config"}}
            - {{name: "{ref}:fixed", args: {{bonus: 1}}}}
            - {{name: "{ref}:positional", signature: trl}}
            - {{name: "{ref}:positional", signature: cosmos}}
    '''))
    assert cli(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    expected = ("native (prompt, completion, **row) -> float; cosmos (to_be_evaluated, reference, *args, "
                "**kwargs) -> float | (float, dict); trl (prompts, completions, **kwargs) -> list[float]; "
                "verl (data_source, solution_str, ground_truth, extra_info, **kwargs) -> float | dict")
    assert (f"spec.rewards[1].name: '{ref}:positional' takes (text, ref): none of its parameters is named "
            f"completion, to_be_evaluated, completions or solution_str. Write it as one of: {expected}; or declare "
            f"its form with signature: native|cosmos|trl|cosmos-group|verl") in err
    assert "spec.rewards[2].name" in err and "completion and completions belong to different signatures" in err
    assert "spec.rewards[3].name" in err and "its parameter data_packer would get no value" in err
    assert "spec.rewards[4].name" in err and "it has no parameter bonus (given in args)" in err
    assert "spec.rewards[5].name" in err and "a trl reward is called with completions= (by name)" in err
    assert "spec.rewards[0]" not in err and "spec.rewards[6]" not in err  # declared cosmos: by position


def test_a_builtin_reward_is_native():
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["rewards"] = [{"name": "math_exact", "signature": "trl"}]
    _, errors = check(doc)
    assert [str(e) for e in errors] == ["spec.rewards[0].signature: the built-in reward math_exact is native"]


# ---- cosmos-rl's (value, dict) and batched results, its config=; verl's compute_score ----------------
def cosmos_parts(to_be_evaluated, reference, *args, **kwargs):  # cosmos-rl: (value, dict of parts)
    return float("MARK" in to_be_evaluated), {"length": len(to_be_evaluated), "note": "not a number"}


def cosmos_batched(to_be_evaluated, reference, *args, config=None, **kwargs):  # group_reward_calculation
    assert isinstance(to_be_evaluated, list) and config.rollout.n_generation == config.algorithm.group_size
    return [float(reference in t) for t in to_be_evaluated], [{"k": i} for i in range(len(to_be_evaluated))]


def verl_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):  # verl's compute_score
    hit = float("MARK" in solution_str and ground_truth == "7" and data_source == "toy/src")
    return {"score": hit, "acc": hit, "index": extra_info["index"], "pred": solution_str}


def test_a_cosmos_rewards_dict_parts_are_reported_beside_it_and_only_its_value_is_summed(monkeypatch):
    g = scored(scorer_for([{"name": "form_rewards:cosmos_parts"}], monkeypatch, cosmos_parts=cosmos_parts))
    assert g.rewards == [1.0, 0.0, 1.0]
    assert g.reward_parts == {"cosmos_parts": [1.0, 0.0, 1.0], "cosmos_parts/length": [8.0, 3.0, 10.0]}


def test_cosmos_batched_form_is_called_once_per_group_with_the_config(monkeypatch):
    s = scorer_for([{"name": "form_rewards:cosmos_batched", "signature": "cosmos-group"}], monkeypatch,
                   cosmos_batched=cosmos_batched)
    g = scored(s, group(["a 42", "b", "42"]))
    assert g.rewards == [1.0, 0.0, 1.0] and g.reward_parts["cosmos_batched/k"] == [0.0, 1.0, 2.0]


def test_verl_compute_score_gets_verls_row_fields_and_its_dict_gives_score_and_metrics(monkeypatch):
    row = {"prompt": PROMPT, "data_source": "toy/src", "reward_model": {"style": "rule", "ground_truth": "7"},
           "extra_info": {"index": 5}}
    g = scored(scorer_for([{"name": "form_rewards:verl_score"}], monkeypatch, verl_score=verl_score), group(row=row))
    assert g.rewards == [1.0, 0.0, 1.0]
    assert g.reward_parts == {"verl_score": [1.0, 0.0, 1.0], "verl_score/acc": [1.0, 0.0, 1.0],
                              "verl_score/index": [5.0, 5.0, 5.0]}  # "pred" is text: not a metric


def test_a_dict_without_score_names_the_reward(monkeypatch):
    def no_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"acc": 1.0}
    with pytest.raises(Exception, match=r"no_score.*returned a dict without 'score'"):
        scored(scorer_for([{"name": "form_rewards:no_score"}], monkeypatch, no_score=no_score))
