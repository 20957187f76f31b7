"""reasoning-gym as a built-in dataset and reward (grpojob.data.reasoning): items from reasoning-gym's
own generators, a weighted mix, disjoint train/test splits, prompts under its system prompt (chat
template or plain), a resumable stream, its own score_answer, and args it cannot honour refused at
validate time with their field paths."""
from __future__ import annotations

import copy
from collections import Counter

import pytest

rg = pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed in this set")

from grpojob.api import parse  # noqa: E402
from grpojob.api.validate import check_plugins  # noqa: E402
from grpojob.data import PromptSettings, PromptStream, load_samples  # noqa: E402
from grpojob.data.builtin import DATASETS  # noqa: E402
from grpojob.rewards.builtin import REWARDS  # noqa: E402
from grpojob.tiny import build_tokenizer  # noqa: E402

from ..api.test_spec import MINIMAL  # noqa: E402

SUMS = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}
BITS = {"name": "count_bits", "weight": 3, "config": {"min_n": 1, "max_n": 255}}
make = DATASETS["reasoning-gym"]
score, fmt = REWARDS["reasoning-gym"], REWARDS["reasoning-gym-format"]


def reward_args(row):
    return {k: v for k, v in row.items() if k != "prompt"}


def job(dataset=None, rewards=None, evaluation=None, chat=False):
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = dataset or {"factory": "reasoning-gym", "args": {"tasks": [SUMS], "size": 20}}
    doc["spec"]["rewards"] = rewards or [{"name": "reasoning-gym"}, {"name": "reasoning-gym-format", "weight": 0.25}]
    doc["spec"]["model"]["useChatTemplate"] = chat
    if evaluation:
        doc["spec"]["evaluation"] = evaluation
    return parse(doc)


def test_items_are_reasoning_gyms_own_with_its_system_prompt():
    rows = list(make(tasks=[SUMS], size=10, seed=3, system_prompt="direct"))
    want = rg.create_dataset("composite", size=10_000, seed=3,
                             datasets=[rg.composite.DatasetSpec(name="chain_sum", weight=1, config=SUMS["config"])])
    own = [want[i] for i in range(200)]
    assert len(rows) == 10
    for r in rows:
        assert r["metadata"]["source_dataset"] == "chain_sum"
        assert {"question": r["question"], "answer": r["answer"], "metadata": r["metadata"]} in own
        assert r["messages"] == [{"role": "system", "content": rg.utils.SYSTEM_PROMPTS["direct"]},
                                 {"role": "user", "content": r["question"]}]
        assert r["prompt"] == rg.utils.SYSTEM_PROMPTS["direct"] + "\n" + r["question"]
    assert rows == list(make(tasks=[SUMS], size=10, seed=3, system_prompt="direct"))  # seeded
    assert rows != list(make(tasks=[SUMS], size=10, seed=4, system_prompt="direct"))


def test_a_mix_follows_its_weights():
    rows = list(make(tasks=[SUMS, BITS], size=400, seed=0))
    counts = Counter(r["metadata"]["source_dataset"] for r in rows)
    assert set(counts) == {"chain_sum", "count_bits"}
    assert 0.65 < counts["count_bits"] / 400 < 0.85  # weight 3 of 4


def test_train_and_test_splits_are_disjoint_whatever_their_seeds_and_sizes():
    small = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    train = {r["question"] for r in make(tasks=[small], size=300, seed=0)}
    test = [r["question"] for r in make(tasks=[small], size=30, seed=9, split="test")]
    assert len(test) == 30 and not train & set(test)
    assert len(train) > 100  # a small task: the train split holds most of its ~200 questions


def test_prompts_get_the_chat_template_or_stay_plain_and_prefill_opens_the_answer():
    tok = build_tokenizer(512)
    args = {"tasks": [SUMS], "size": 4, "system_prompt": "simple", "prefill": True}
    spec = job({"factory": "reasoning-gym", "args": args, "maxPromptLength": 512}, chat=True).spec
    s = load_samples(PromptSettings.of(spec), tok)[0]
    assert s.prompt == (f"<|im_start|>system\n{rg.utils.SYSTEM_PROMPTS['simple']}<|im_end|>\n<|im_start|>user\n"
                        f"{s.row['question']}<|im_end|>\n<|im_start|>assistant\n<answer>")
    plain = load_samples(PromptSettings.of(job({"factory": "reasoning-gym", "args": args,
                                                "maxPromptLength": 512}).spec), tok)[0]
    assert plain.prompt == f"{rg.utils.SYSTEM_PROMPTS['simple']}\n{plain.row['question']}\n<answer>"


def test_the_streams_position_is_checkpointed():
    tok = build_tokenizer(512)
    spec = job({"factory": "reasoning-gym", "args": {"tasks": [SUMS, BITS], "size": 12}, "maxPromptLength": 512}).spec
    stream = PromptStream(PromptSettings.of(spec), tok)
    stream.take(17)
    state = stream.state_dict()
    ahead = [s.row["question"] for s in stream.take(10)]
    again = PromptStream(PromptSettings.of(spec), tok)
    again.load_state_dict(state)
    assert state == {"epoch": 1, "position": 5}
    assert [s.row["question"] for s in again.take(10)] == ahead


def test_the_reward_is_the_tasks_score_of_the_tagged_answer():
    row = next(iter(make(tasks=[SUMS], size=1, seed=5)))
    right, kw = row["answer"], reward_args(row)
    wrong = str(int(right) + 1)
    assert score("p", f"thinking... <answer>{right}</answer>", **kw) == 1.0
    assert score("p", f"<answer>{wrong}</answer>", **kw) == 0.0
    assert score("p", f"the answer is {right}", **kw) == 0.0  # no tags: not the form the prompt asks
    assert score("p", f"<answer>{right}", **kw) == 0.0  # unclosed
    assert (fmt("p", f"<answer>{wrong}</answer>", **kw), fmt("p", right, **kw)) == (1.0, 0.0)
    opened = reward_args(next(iter(make(tasks=[SUMS], size=1, seed=5, prefill=True))))
    assert score("p", f"{right}</answer>", **opened) == 1.0 and fmt("p", f"{right}</answer>", **opened) == 1.0
    assert score("p", right, **opened) == 1.0 and fmt("p", right, **opened) == 0.0  # the reply's end closes it
    assert score("p", f"{right} is it", **opened) == len(right) / len(f"{right} is it")  # the task's partial credit
    assert score("p", "<answer>1</answer>", answer="1") == 0.0  # not a reasoning-gym row


def test_the_reward_uses_the_tasks_own_partial_credit():
    row = next(iter(make(tasks=[{"name": "spell_backward", "config": {"min_word_len": 5, "max_word_len": 6}}],
                         size=1, seed=2)))
    got = score("p", f"<answer>{row['answer']}x</answer>", **reward_args(row))
    ds = rg.create_dataset("spell_backward", min_word_len=5, max_word_len=6)
    assert got == ds.score_answer(row["answer"] + "x", row) and 0 < got < 1


def test_validate_refuses_what_cannot_be_scored_with_field_paths():
    bad = {"factory": "reasoning-gym", "args": {"size": 0, "system_prompt": "loud", "tasks": [
        {"name": "no_such_task"}, {"name": "propositional_logic"}, {"name": "chain_sum", "config": {"bogus": 1}},
        {"name": "count_bits", "weight": -1, "colour": "red"}, {"name": "basic_arithmetic", "config": {"seed": 2}}]}}
    evaluation = {"dataset": {"factory": "reasoning-gym", "args": {"tasks": [], "split": "test"}}}
    got = {e.path: e.message for e in check_plugins(job(bad, evaluation=evaluation))}
    assert sorted(got) == ["spec.dataset.args.size", "spec.dataset.args.system_prompt", "spec.dataset.args.tasks[0].name",
                           "spec.dataset.args.tasks[1].name", "spec.dataset.args.tasks[2].config",
                           "spec.dataset.args.tasks[3].colour", "spec.dataset.args.tasks[3].weight",
                           "spec.dataset.args.tasks[4].config.seed", "spec.evaluation.dataset.args.tasks"]
    assert "no reference answer" in got["spec.dataset.args.tasks[1].name"]
    assert "chain_sum" in got["spec.dataset.args.tasks[0].name"]  # the names it has
    assert "bogus" in got["spec.dataset.args.tasks[2].config"]
    assert check_plugins(job()) == []


def test_the_signature_is_checked_without_the_package():
    from grpojob.api.validate import InvalidSpec

    with pytest.raises(InvalidSpec) as e:
        job({"factory": "reasoning-gym", "args": {"tasks": "chain_sum", "sizes": 3}})
    assert sorted(f.path for f in e.value.errors) == ["spec.dataset.args.sizes", "spec.dataset.args.tasks"]
