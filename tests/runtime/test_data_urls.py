"""Datasets by URL (docs/data.md): malformed URLs refused at validation with their field path;
parquet and jsonl read from a real S3 API (moto's server on 127.0.0.1) whole and streamed, with
obstore, the client the runtime uses; a missing object, bucket or credentials said at the
trainer's start; a streamed dataset's seeded shuffle and its checkpointed position."""
from __future__ import annotations

import copy
import functools
import http.server
import socket
import threading

import pytest
import torch

from grpojob.api import parse
from grpojob.api.validate import check
from grpojob.data import DatasetError, PromptSettings, load_samples
from grpojob.data.streaming import prompt_stream
from grpojob.tiny import build_tokenizer
from tests.helpers.s3 import jsonl, parquet, s3, s3_server  # noqa: F401 - fixtures

from ..api.test_spec import MINIMAL

ROWS = [{"question": f"what is {i} + {i} ?", "solution": str(2 * i), "id": i} for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def doc_with(**dataset) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = {"promptField": "question", "answerField": "solution", **dataset}
    return doc


def spec_with(**dataset):
    return parse(doc_with(**dataset)).spec


VALID = ["s3://bucket/data/train.parquet", "s3://bucket/data/*.jsonl", "gs://bucket/d/train-*.parquet",
         "az://container/d/train.csv", "abfss://container@account.dfs.core.windows.net/d/train.parquet",
         "https://example.com/d/train.jsonl", "hf://datasets/openai/gsm8k/main/train-*.parquet",
         "hf://datasets/openai/gsm8k@main/main/test-00000-of-00001.parquet", "/data/train.jsonl"]


@pytest.mark.parametrize("path", VALID)
def test_every_documented_url_form_validates(path):
    job, errors = check(doc_with(path=path))
    assert errors == [] and job.spec.dataset.path == path


def test_a_hub_dataset_by_name_takes_config_and_split():
    job, errors = check(doc_with(path="hf://datasets/openai/gsm8k", config="main", split="test"))
    assert errors == [], errors


BAD = [
    (dict(path="ftp://host/d.jsonl"), "spec.dataset.path", "'ftp://' is not a dataset location"),
    (dict(path="s3://"), "spec.dataset.path", "names no bucket"),
    (dict(path="s3://bucket"), "spec.dataset.path", "names no file"),
    (dict(path="s3://bucket/a b.jsonl"), "spec.dataset.path", "white space"),
    (dict(path="gs://Bad!Bucket/d.jsonl"), "spec.dataset.path", "not a valid bucket"),
    (dict(path="https:///d.jsonl"), "spec.dataset.path", "names no host"),
    (dict(path="hf://openai/gsm8k"), "spec.dataset.path", "dataset repositories only"),
    (dict(path="hf://datasets/openai"), "spec.dataset.path", "names no repository"),
    (dict(path="hf://datasets/openai/gsm8k@"), "spec.dataset.path", "needs a revision"),
    (dict(path="s3://bucket/d.jsonl", config="main"), "spec.dataset.config", "Hub dataset by name"),
    (dict(path="/data/d.jsonl", split="test"), "spec.dataset.split", "Hub dataset by name"),
    (dict(path="hf://datasets/openai/gsm8k", format="parquet"), "spec.dataset.format", "own format"),
    (dict(factory="toy", streaming=True), "spec.dataset.streaming", "reads a path"),
    (dict(path="s3://b1/d.jsonl", credentialsSecret="Not_A_Name"), "spec.dataset.credentialsSecret", "DNS-1123"),
    (dict(path="s3://b1/d.jsonl", shuffleBuffer=0), "spec.dataset.shuffleBuffer", ">= 1"),
]


@pytest.mark.parametrize("dataset,path,words", BAD, ids=[f"{i}:{p}" for i, (_, p, _) in enumerate(BAD)])
def test_malformed_locations_are_refused_at_validation_with_the_field_path(dataset, path, words):
    job, errors = check(doc_with(**dataset))
    assert job is None
    assert any(e.path == path and words in e.message for e in errors), [str(e) for e in errors]


def test_every_location_error_of_a_spec_is_reported_at_once():
    doc = doc_with(path="s3://bucket", config="main")
    doc["spec"]["evaluation"] = {"dataset": {"path": "hf://models/x/y"}}
    _, errors = check(doc)
    assert {"spec.dataset.path", "spec.dataset.config", "spec.evaluation.dataset.path"} <= {e.path for e in errors}


def test_parquet_and_jsonl_from_s3_are_read_whole_and_streamed(s3, tokenizer):
    s3.put("d/train.parquet", parquet(ROWS[:40]))
    s3.put("d/more.parquet", parquet(ROWS[40:]))
    s3.put("d/train.jsonl", jsonl(ROWS))
    want = [r["question"] for r in ROWS]
    whole = load_samples(PromptSettings.of(spec_with(path=f"s3://{s3.name}/d/train.jsonl")), tokenizer)
    assert [s.prompt for s in whole] == want and whole[3].row["answer"] == "6"
    globbed = load_samples(PromptSettings.of(spec_with(path=f"s3://{s3.name}/d/*.parquet")), tokenizer)
    assert sorted(s.prompt for s in globbed) == sorted(want)
    for path in (f"s3://{s3.name}/d/train.parquet", f"s3://{s3.name}/d/train.jsonl"):
        stream = prompt_stream(PromptSettings.of(spec_with(path=path, streaming=True, shuffle=False)), tokenizer)
        n = 40 if path.endswith("parquet") else 60
        assert [s.prompt for s in stream.take(n)] == want[:n]
        assert [s.seq for s in stream.take(2)] == [n, n + 1]  # the next epoch goes on
        assert stream.epoch == 1


def test_a_streamed_evaluation_set_reads_only_the_rows_it_evaluates(s3, tokenizer):
    s3.put("d/test.parquet", parquet(ROWS, row_group_size=8))
    spec = spec_with(path=f"s3://{s3.name}/d/test.parquet", streaming=True)
    assert [s.row["id"] for s in load_samples(PromptSettings.of(spec), tokenizer, limit=5)] == [0, 1, 2, 3, 4]  # in file order


def test_a_streamed_dataset_resumes_where_it_stopped_through_a_checkpoint(s3, tokenizer, tmp_path):
    s3.put("d/train.parquet", parquet(ROWS, row_group_size=7))
    spec = spec_with(path=f"s3://{s3.name}/d/train.parquet", streaming=True, shuffleBuffer=16)
    straight = [(s.index, s.row["id"]) for s in prompt_stream(PromptSettings.of(spec), tokenizer).take(150)]
    assert all(index == row for index, row in straight)  # a sample's index is its row's place in the file
    ids = [row for _, row in straight]
    assert sorted(ids[:60]) == list(range(60)) and sorted(ids[60:120]) == list(range(60))
    assert ids[:60] != list(range(60)) and ids[:60] != ids[60:120]  # shuffled, anew each epoch
    # stopped mid-file, with the file read to its end (the buffer draining), at the epoch's end, after it
    for cut in (25, 50, 60, 61):
        first = prompt_stream(PromptSettings.of(spec), tokenizer)
        head = [(s.index, s.row["id"]) for s in first.take(cut)]
        if cut == 25:
            assert first.read == 16 + 24  # lazily: the buffer's 16 rows and one per later draw, of the file's 60
        torch.save({"data": first.state_dict()}, tmp_path / "state.pt")  # as the checkpoint manager does
        state = torch.load(tmp_path / "state.pt", weights_only=True)["data"]
        second = prompt_stream(PromptSettings.of(spec), tokenizer)
        second.load_state_dict(state)
        tail = [(s.index, s.row["id"]) for s in second.take(150 - cut)]
        assert head + tail == straight, f"stopped after {cut}"  # the same rows in the same order
        # prompts issued before the checkpoint are still there for the rollout manager's resume
        assert second.sample_at(cut - 1).row["id"] == head[-1][1] and second.sample_at(cut - 1).seq == cut - 1


def test_the_shuffle_is_seeded(s3, tokenizer):
    s3.put("d/train.jsonl", jsonl(ROWS))
    orders = []
    for seed in (1, 1, 2):
        doc = doc_with(path=f"s3://{s3.name}/d/train.jsonl", streaming=True, shuffleBuffer=8)
        doc["spec"].setdefault("training", {})["seed"] = seed
        spec = parse(doc).spec
        orders.append([s.row["id"] for s in prompt_stream(PromptSettings.of(spec), tokenizer).take(60)])
    assert orders[0] == orders[1] != orders[2]
    # a buffer of 8 rows: at position p, rows 0 .. p+7 have been read, so no later row comes out
    assert all(pos >= index - 7 for pos, index in enumerate(orders[0]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("streaming", [False, True])
def test_missing_objects_buckets_and_credentials_fail_with_the_field_path(s3, tokenizer, monkeypatch, streaming):
    cases = [(f"s3://{s3.name}/nothing.parquet", "does not exist"),
             (f"s3://{s3.name}/d/none-*.parquet", "does not exist"),
             ("s3://no-such-bucket-here/d.parquet", "does not exist")]
    for path, words in cases:
        with pytest.raises(DatasetError) as e:
            load_samples(PromptSettings.of(spec_with(path=path, streaming=streaming)), tokenizer)
        assert str(e.value).startswith("spec.dataset.path: ") and words in str(e.value), str(e.value)
    fresh = s3.server.bucket()  # obstore keeps a client per bucket, made with the credentials of then
    fresh.put("d/train.parquet", parquet(ROWS))
    # no credentials: obstore falls back to the instance metadata service, pointed here at a closed
    # local port (never a real one)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(DatasetError) as e:
        load_samples(PromptSettings.of(spec_with(path=f"s3://{fresh.name}/d/train.parquet", streaming=streaming)), tokenizer)
    assert str(e.value).startswith("spec.dataset.path: ") and "check the credentials: AWS_ACCESS_KEY_ID" in str(e.value)
    assert "credentialsSecret" in str(e.value)


def test_a_web_url_is_read_through_fsspec(tmp_path, tokenizer):
    (tmp_path / "train.jsonl").write_bytes(jsonl(ROWS))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/train.jsonl"
        assert [s.prompt for s in load_samples(PromptSettings.of(spec_with(path=url)), tokenizer)] == [r["question"] for r in ROWS]
        stream = prompt_stream(PromptSettings.of(spec_with(path=url, streaming=True, shuffle=False)), tokenizer)
        assert [s.index for s in stream.take(5)] == [0, 1, 2, 3, 4]
        with pytest.raises(DatasetError, match="spec.dataset.path: .*does not exist"):
            load_samples(PromptSettings.of(spec_with(path=url.replace("train", "missing"))), tokenizer)
    finally:
        server.shutdown()


_HUB_PROBE = """
import sys
from grpojob.api import parse
from grpojob.data import DatasetError, PromptSettings, load_samples
from grpojob.tiny import build_tokenizer
try:
    load_samples(PromptSettings.of(parse(__import__("json").loads(sys.argv[1])).spec), build_tokenizer(512), limit=3)
except DatasetError as e:
    print(e)
"""


@pytest.mark.parametrize("dataset,env,fix", [
    (dict(path="hf://datasets/openai/gsm8k", config="main", streaming=True), {"HF_HUB_OFFLINE": "1"},
     "the Hub is switched off in the trainer's environment (HF_HUB_OFFLINE"),
    (dict(path="hf://datasets/openai/gsm8k/main/train-*.parquet"), {"HF_ENDPOINT": "closed"},
     "check the trainer's network and HF_ENDPOINT"),
], ids=["by-name-offline", "files-unreachable"])
def test_a_hub_dataset_that_cannot_be_reached_is_said_at_the_start_with_the_field(dataset, env, fix, tmp_path):
    """No network here: the Hub path runs through datasets and huggingface_hub up to the request,
    and the failure is the trainer's clear refusal (the Hub itself is not reached: docs/data.md)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: (f"http://127.0.0.1:{_closed_port()}" if v == "closed" else v) for k, v in env.items()}
    r = subprocess.run([sys.executable, "-c", _HUB_PROBE, json.dumps(doc_with(**dataset))], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "HF_HOME": str(tmp_path / "hf"), **env})
    assert r.stdout.startswith(f"spec.dataset.path: cannot reach '{dataset['path']}'"), r.stdout + r.stderr[-2000:]
    assert fix in r.stdout, r.stdout


def test_the_gsm8k_example_reads_gsm8k_by_url_and_evaluates_on_its_test_split(tokenizer):
    from pathlib import Path

    from grpojob.api import load_file
    from grpojob.data import PromptSettings, render_prompt

    job = parse(load_file(Path(__file__).resolve().parents[2] / "examples" / "qwen-gsm8k.yaml"))
    d, ev = job.spec.dataset, job.spec.evaluation
    assert (d.path, d.config, d.split, d.streaming) == ("hf://datasets/openai/gsm8k", "main", "train", True)
    assert (ev.dataset.path, ev.dataset.config, ev.dataset.split) == ("hf://datasets/openai/gsm8k", "main", "test")
    assert "math_exact" in [r.name for r in job.spec.rewards]
    row = {"question": "Natalia sold 48 clips. How many?", "answer": "48 #### 48"}
    plain = job.spec.model_copy(update={"model": job.spec.model.model_copy(update={"use_chat_template": False})})
    assert render_prompt(PromptSettings.of(plain), tokenizer, row, 0) == (
        "Natalia sold 48 clips. How many?\nLet's think step by step and output the final answer after \"####\".")
