"""Dataset plug-ins: a dataset class (cosmos-rl's shape), factories that must say what they
return, and local files through `datasets.load_dataset` (csv, json, parquet shards) next to
save_to_disk directories."""
from __future__ import annotations

import json
import textwrap

import pytest

from grpojob.data import DatasetError, PromptSettings, load_samples

from ..runtime.test_data import ROWS, job_with, tokenizer  # noqa: F401 - the module's tokenizer fixture


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    (tmp_path / "user_data.py").write_text(textwrap.dedent('''
        import json

        def make_dataset(path, n):  # the issue's new user: writes a file, returns nothing
            with open(path, "w") as f:
                for i in range(n):
                    f.write(json.dumps({"question": f"what is {i} + {i} ?", "solution": str(2 * i)}) + "\\n")

        def strings(n):
            return [f"q{i}" for i in range(n)]

        class Chat:
            def __init__(self, n=3):
                self.n, self.seen = n, None

            def setup(self, spec, tokenizer):
                self.seen = (spec.dataset.max_prompt_length, tokenizer is not None)

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                if i == 0:
                    return f"what is {i} + {i} ?"
                if i == 1:
                    return [{"role": "user", "content": "what is 1 + 1 ?"}]
                return {"question": "what is 2 + 2 ?", "topic": "sums"}

            def reference_answer(self, i):
                return str(2 * i)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_factory_that_returns_nothing_is_told_what_to_return(user_code, tmp_path, tokenizer):  # noqa: F811
    spec = job_with(factory="user_data:make_dataset", args={"path": str(tmp_path / "out.jsonl"), "n": 4})
    with pytest.raises(DatasetError) as e:
        load_samples(PromptSettings.of(spec), tokenizer)
    msg = str(e.value)
    assert msg.startswith("spec.dataset.factory 'user_data:make_dataset' returned None: a dataset factory must "
                          "return an iterable of dict rows")
    assert "set spec.dataset.path instead" in msg
    # ...and the file it wrote works as spec.dataset.path
    assert len(load_samples(PromptSettings.of(job_with(path=str(tmp_path / "out.jsonl"))), tokenizer)) == 4
    with pytest.raises(DatasetError, match="row 0 is a str, not a dict"):
        load_samples(PromptSettings.of(job_with(factory="user_data:strings", args={"n": 2})), tokenizer)


def test_a_dataset_class_gives_prompts_chat_and_rows_with_reference_answers(user_code, tokenizer):  # noqa: F811
    spec = job_with(**{"class": "user_data:Chat", "args": {"n": 3}})
    samples = load_samples(PromptSettings.of(spec), tokenizer)
    assert [s.row["solution"] for s in samples] == ["0", "2", "4"]  # reference_answer -> answerField
    assert [s.row["answer"] for s in samples] == ["0", "2", "4"]  # ...which the rewards read as `answer`
    assert samples[0].prompt == "what is 0 + 0 ?" and samples[2].row["topic"] == "sums"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "what is 1 + 1 ?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert samples[1].prompt == chat  # a list of messages goes through the chat template


def test_load_dataset_with_local_csv_json_and_parquet_shards(tmp_path, tokenizer):  # noqa: F811
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_csv(str(tmp_path / "d.csv"))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))  # a JSON array, not JSON lines
    ds.select(range(5)).to_parquet(str(tmp_path / "part-0.parquet"))
    ds.select(range(5, 10)).to_parquet(str(tmp_path / "part-1.parquet"))
    ds.save_to_disk(str(tmp_path / "disk"))
    want = [(s["question"], s["solution"]) for s in ROWS]
    for path in ("d.csv", "d.json", "part-*.parquet", "disk"):
        samples = load_samples(PromptSettings.of(job_with(path=str(tmp_path / path))), tokenizer)
        got = [(s.row["question"], str(s.row["solution"])) for s in samples]
        assert got == want, path
    with pytest.raises(DatasetError, match="no file matches"):
        load_samples(PromptSettings.of(job_with(path=str(tmp_path / "none-*.csv"))), tokenizer)


COSMOS_STYLE = '''
from typing import Any, Optional


class Query:  # cosmos-rl's customization guide: setup(config, tokenizer, *args, **kwargs), query_reference_answer
    def setup(self, config, tokenizer, *args, **kwargs):
        self.config, self.tokenizer = config, tokenizer
        self.data = [{"q": f"what is {i} + {i} ?", "reference_answer": str(2 * i)} for i in range(3)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]["q"]

    def query_reference_answer(self, idx) -> Optional[Any]:
        return self.data[idx]["reference_answer"]


class Get:  # its other examples: get_reference_answer, and no setup at all
    def __len__(self):
        return 2

    def __getitem__(self, idx):
        return f"q{idx}"

    def get_reference_answer(self, idx):
        return f"a{idx}"


class Both(Get):
    def reference_answer(self, idx):
        return None
'''


def test_cosmos_rl_dataset_classes_run_with_their_own_method_names(tmp_path, monkeypatch, tokenizer):  # noqa: F811
    (tmp_path / "cosmos_data.py").write_text(COSMOS_STYLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = job_with(**{"class": "cosmos_data:Query"})
    samples = load_samples(PromptSettings.of(spec), tokenizer)
    assert [s.row["answer"] for s in samples] == ["0", "2", "4"]
    import cosmos_data
    seen = []
    monkeypatch.setattr(cosmos_data.Query, "__len__", lambda self: seen.append(self.config) or 3)
    load_samples(PromptSettings.of(spec), tokenizer)
    config = seen[0]  # the job's spec, under cosmos-rl's names too
    assert config.policy.model_name_or_path == spec.model.path and config.dataset is spec.dataset
    assert config.rollout.n_generation == spec.algorithm.group_size
    assert config.train.train_policy.prompt_column_name == spec.dataset.prompt_field
    got = load_samples(PromptSettings.of(job_with(**{"class": "cosmos_data:Get"})), tokenizer)
    assert [(s.prompt, s.row["answer"]) for s in got] == [("q0", "a0"), ("q1", "a1")]
    from grpojob.data import check_class
    assert "has reference_answer and get_reference_answer: keep one" in check_class(cosmos_data.Both)
