"""Datasets from every local source, chat templates, length filtering, and a resumable,
rank-sharded prompt stream whose global order does not depend on the world size."""
from __future__ import annotations

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpojob.api import parse
from grpojob.data import DatasetError, PromptSettings, PromptStream, load_samples
from grpojob.tiny import build_tokenizer

from ..api.test_spec import MINIMAL

ROWS = [{"question": f"what is {i} + {i} ?", "solution": str(2 * i)} for i in range(10)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def job_with(**dataset):
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = {"promptField": "question", "answerField": "solution", **dataset}
    return parse(doc).spec


def test_jsonl_parquet_and_disk_give_the_same_samples(tmp_path, tokenizer):
    import datasets

    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "disk"))
    got = [load_samples(PromptSettings.of(job_with(path=str(tmp_path / p))), tokenizer) for p in ("d.jsonl", "d.parquet", "disk")]
    prompts = [[s.prompt for s in g] for g in got]
    assert prompts[0] == prompts[1] == prompts[2] == [r["question"] for r in ROWS]
    assert got[0][3].row["answer"] == "6"  # answerField is exposed to rewards as `answer`
    assert tokenizer.decode(got[0][3].prompt_ids) == "what is 3 + 3 ?"


def test_messages_use_the_chat_template(tmp_path, tokenizer):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}]
    (tmp_path / "c.jsonl").write_text(json.dumps(rows[0]) + "\n")
    s = load_samples(PromptSettings.of(job_with(path=str(tmp_path / "c.jsonl"), messagesField="messages")), tokenizer)[0]
    assert s.prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_long_prompts_are_dropped_and_all_dropped_is_an_error(tmp_path, tokenizer):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    assert len(load_samples(PromptSettings.of(job_with(path=str(tmp_path / "d.jsonl"), maxPromptLength=64)), tokenizer)) == 10
    with pytest.raises(DatasetError, match="maxPromptLength"):
        load_samples(PromptSettings.of(job_with(path=str(tmp_path / "d.jsonl"), maxPromptLength=2)), tokenizer)


@pytest.mark.parametrize("dataset,words", [
    ({"path": "/nonexistent.jsonl"}, "does not exist"),
    ({"path": "x.csv"}, "does not exist"),
    ({"factory": "toy", "args": {"categories": ["fish"]}}, "fish"),
    ({"factory": "toy", "promptField": "nope"}, "no field 'nope'"),
])
def test_bad_datasets_say_why(dataset, words, tokenizer):
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = dataset
    with pytest.raises(DatasetError, match=words):
        load_samples(PromptSettings.of(parse(doc).spec), tokenizer)


def test_builtin_factories(tokenizer):
    toy = load_samples(PromptSettings.of(job_with(factory="toy", promptField="prompt", answerField="answer")), tokenizer)
    assert len(toy) == 64 and {s.row["answer"] for s in toy} == {"animals", "colors", "numbers"}
    cd = load_samples(PromptSettings.of(job_with(factory="countdown", promptField="prompt", answerField="answer",
                               args={"size": 5})), tokenizer)
    assert len(cd) == 5 and all("numbers" in s.row and "target" in s.row for s in cd)


def test_stream_covers_each_epoch_once_in_a_seeded_order_and_resumes(tokenizer):
    spec = job_with(factory="toy", promptField="prompt", answerField="answer", args={"size": 10})
    stream = PromptStream(PromptSettings.of(spec), tokenizer)
    first = stream.take(25)  # crosses two epoch boundaries
    assert [s.seq for s in first] == list(range(25))
    for epoch in (first[0:10], first[10:20]):
        assert sorted(s.index for s in epoch) == list(range(10))
    assert [s.index for s in first[:10]] != [s.index for s in first[10:20]]  # reshuffled each epoch
    assert [s.index for s in PromptStream(PromptSettings.of(spec), tokenizer).take(25)] == [s.index for s in first]  # seeded
    # any position can be rebuilt (pending prompts after a resume), and the position resumes
    assert [stream.sample_at(s.seq).index for s in first] == [s.index for s in first]
    state = stream.state_dict()
    expected = [(s.seq, s.index) for s in stream.take(7)]
    again = PromptStream(PromptSettings.of(spec), tokenizer)
    again.load_state_dict(state)
    assert [(s.seq, s.index) for s in again.take(7)] == expected
