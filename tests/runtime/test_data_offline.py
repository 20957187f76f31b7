"""The Hub's offline switch governs the Hub only (issue 43): with HF_HUB_OFFLINE, HF_DATASETS_OFFLINE
and TRANSFORMERS_OFFLINE set, an s3:// dataset is read from a real S3 API (moto's server on
127.0.0.1, plain http, as an in-cluster MinIO) whole, streamed and as an evaluation set; a changed
object is read anew, never served from a cache; hf:// still honours the switch.

The switch is read when `datasets` and `huggingface_hub` are imported, so each reader is a fresh
interpreter with the variables set, as a trainer pod is."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.s3 import jsonl, parquet, s3, s3_server  # noqa: F401 - fixtures

from ..api.test_spec import MINIMAL

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

_READER = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from grpojob.api import parse
from grpojob.data import DatasetError, PromptSettings, load_samples
from grpojob.data.streaming import prompt_stream
from grpojob.tiny import build_tokenizer
from grpojob.leader.evaluation.evaluator import WHERE, evaluation_spec
for doc, n in json.loads(sys.argv[1]):  # one line of output per dataset
    spec = parse(doc).spec
    settings = PromptSettings.of(spec)
    try:
        if spec.evaluation is not None:  # the held-out set, read as the evaluator reads it
            samples = load_samples(PromptSettings.of(evaluation_spec(spec)), build_tokenizer(512), WHERE, limit=n)
        elif settings.dataset.streaming:
            samples = prompt_stream(settings, build_tokenizer(512)).take(n)
        else:
            samples = load_samples(settings, build_tokenizer(512), limit=n)
        print(json.dumps([s.row["id"] for s in samples]))
    except DatasetError as e:
        print("DatasetError: " + " ".join(str(e).split()))
"""


def rows(first: int, n: int) -> list[dict]:
    return [{"prompt": f"list animals : {i}", "answer": "animals", "id": i} for i in range(first, first + n)]


def doc_with(**dataset) -> dict:
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["dataset"] = {"shuffle": False, **dataset}
    return doc


def read_all(reads: list[tuple[dict, int]], env: dict[str, str], hf_home) -> tuple[list[str], str]:
    """What a fresh trainer-like process reads of each (dataset, rows): the ids, or the DatasetError;
    and its log."""
    run_env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
    r = subprocess.run([sys.executable, "-c", _READER, json.dumps(reads)], capture_output=True, text=True,
                       timeout=120, env={**run_env, "HF_HOME": str(hf_home), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines(), r.stderr


def read(doc: dict, n: int, env: dict[str, str], hf_home) -> tuple[str, str]:
    [out], log = read_all([(doc, n)], env, hf_home)
    return out, log


def test_offline_hub_variables_leave_an_s3_dataset_readable_whole_streamed_and_for_evaluation(s3, tmp_path):
    s3.put("d/train.jsonl", jsonl(rows(0, 20)))
    s3.put("d/part-0.parquet", parquet(rows(100, 8)))
    s3.put("d/part-1.parquet", parquet(rows(108, 8)))
    env = {**OFFLINE, **{k: os.environ[k] for k in os.environ if k.startswith("AWS_")}}
    env.pop("AWS_ALLOW_HTTP")  # plain http allowed because the endpoint says http://, with a warning
    evaluation = doc_with(factory="toy")
    evaluation["spec"]["evaluation"] = {"dataset": {"path": f"s3://{s3.name}/d/part-*.parquet", "streaming": True}}
    (whole, streamed, evaluated), log = read_all([
        (doc_with(path=f"s3://{s3.name}/d/train.jsonl"), 20),
        (doc_with(path=f"s3://{s3.name}/d/part-*.parquet", streaming=True), 16),
        (evaluation, 3)], env, tmp_path / "hf")
    assert json.loads(whole) == list(range(20)), whole
    assert json.loads(streamed) == list(range(100, 116)), streamed
    assert json.loads(evaluated) == [100, 101, 102], evaluated
    assert "plain http (AWS_ENDPOINT_URL=http://127.0.0.1" in log and "unencrypted" in log, log
    assert log.count("plain http") == 1, log  # one line per endpoint, not one per file or read


def test_a_changed_object_is_read_anew_with_a_shared_cache(s3, tmp_path):
    """The same s3:// key, another content between two offline readers sharing HF_HOME (a pod's
    volume): the second reads the new rows; an unchanged object is not copied again."""
    env = {**OFFLINE, **{k: os.environ[k] for k in os.environ if k.startswith("AWS_")}}
    path = s3.put("d/train.parquet", parquet(rows(0, 12)))
    hf_home = tmp_path / "hf"
    assert json.loads(read(doc_with(path=path), 12, env, hf_home)[0]) == list(range(12))
    copies = sorted((hf_home / "datasets" / "grpojob-objects").rglob("train.parquet"))
    assert len(copies) == 1
    mtime = copies[0].stat().st_mtime_ns
    assert json.loads(read(doc_with(path=path), 12, env, hf_home)[0]) == list(range(12))
    assert copies[0].stat().st_mtime_ns == mtime  # unchanged object: its copy reused
    s3.put("d/train.parquet", parquet(rows(500, 12)))
    assert json.loads(read(doc_with(path=path), 12, env, hf_home)[0]) == list(range(500, 512))
    assert len(list((hf_home / "datasets" / "grpojob-objects").rglob("train.parquet"))) == 1  # the stale copy went


def test_the_hub_still_honours_the_offline_switch(tmp_path):
    out, _ = read(doc_with(path="hf://datasets/openai/gsm8k/main/train-*.parquet"), 3, OFFLINE, tmp_path / "hf")
    assert out.startswith("DatasetError: spec.dataset.path: cannot reach 'hf://datasets/openai/gsm8k"), out
    assert "HF_HUB_OFFLINE" in out, out
