"""`grpojob run` with its dataset streamed from an S3 API (moto's server on 127.0.0.1), credentials
from the user's environment as a local run takes them (docs/data.md): interrupted with Ctrl-C
mid-epoch and run again, it trains every row of its first steps once and none twice. With the Hub
switched off (an air-gapped cluster), it trains from the plain-http store, and a changed object is
trained on at the next run."""
from __future__ import annotations

import os
import shutil
import signal

import pytest

from grpojob.data.builtin import toy
from grpojob.local.progress import read_records
from tests.helpers.s3 import jsonl, parquet, s3, s3_server  # noqa: F401 - fixtures

from .test_run import grpojob_run, processes_of, wait_steps

pytestmark = pytest.mark.slow


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    for pid in processes_of(tmp_path / "run"):  # never leave a process behind, even on failure
        os.kill(pid, signal.SIGKILL)


def test_a_run_streams_its_dataset_from_s3_and_resumes_mid_epoch(s3, workdir):
    rows = [{**row, "id": i} for i, row in enumerate(toy(size=400, seed=3))]
    path = s3.put("toy/train-00000.parquet", parquet(rows[:200], row_group_size=32))
    s3.put("toy/train-00001.parquet", parquet(rows[200:], row_group_size=32))
    glob = path.replace("train-00000.parquet", "train-*.parquet")
    run_dir = workdir / "run"
    sets = ("training.steps=10", "checkpoint.everySteps=100", "algorithm.maxStaleness=1",
            f"dataset={{path: '{glob}', streaming: true, shuffleBuffer: 64, maxPromptLength: 32}}")
    proc = grpojob_run(run_dir, *sets, cwd=workdir)  # AWS_* from this process's environment (the s3 fixture)
    wait_steps(run_dir, 3, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "step-" in out, out
    done = len(read_records(run_dir / "metrics.jsonl"))
    assert processes_of(run_dir) == []

    proc = grpojob_run(run_dir, *sets, cwd=workdir)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert f"resuming after step {done}" in out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    trained = [i for r in records for i in r["sample_ids"]]
    assert len(trained) == len(set(trained)) == 10 * 16, "a row was trained twice"
    assert max(trained) < 10 * 16 + 64, "rows beyond what the stream and its buffer had read"


def test_a_missing_object_stops_grpojob_run_with_the_field_path(s3, workdir):
    """The trainer's refusal on screen, not a launcher's traceback, and no restart."""
    proc = grpojob_run(workdir / "run", f"dataset={{path: 's3://{s3.name}/nothing/train.parquet', streaming: true}}",
                       cwd=workdir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert f"DatasetError: spec.dataset.path: 's3://{s3.name}/nothing/train.parquet' does not exist" in out, out
    assert "Traceback" not in out and "restart" not in out.lower(), out


def test_an_air_gapped_run_trains_from_a_plain_http_store_and_on_a_changed_object(s3, workdir, monkeypatch):
    """HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1, an empty HF_HOME, AWS_ALLOW_HTTP unset (the
    endpoint's http:// is the choice): the run trains. The object is then replaced by a larger one;
    a second run sharing HF_HOME (a pod's volume) trains on the new rows, not a cached copy."""
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(workdir / "hf")}
    path = s3.put("toy/train.jsonl", jsonl(list(toy(size=16, seed=1))))
    sets = ("training.steps=2", "checkpoint.everySteps=100", f"dataset={{path: '{path}', maxPromptLength: 32}}")
    trained = []
    for rows in (16, 64):
        if rows == 64:
            s3.put("toy/train.jsonl", jsonl(list(toy(size=64, seed=2))))
            shutil.rmtree(workdir / "run")  # a new run (no resume), the same HF_HOME
        proc = grpojob_run(workdir / "run", *sets, cwd=workdir, env=env)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        trained.append([i for r in read_records(workdir / "run" / "metrics.jsonl") for i in r["sample_ids"]])
        log = (workdir / "run" / "logs" / "trainer-0.log").read_text()
        assert "plain http (AWS_ENDPOINT_URL=http://127.0.0.1" in log and "unencrypted" in log
    assert len(trained[0]) == 2 * 16 and max(trained[0]) < 16  # the 16 rows, twice over
    assert max(trained[1]) >= 16, "the second run trained on the old object's 16 rows"


def test_a_run_checkpoints_into_s3_is_interrupted_and_resumes_from_the_store(s3, workdir):
    """spec.checkpoint.path an S3 URL (issue #56): Ctrl-C checkpoints into the store (the trainer
    suspends), the next run resumes from there; nothing is written to a local checkpoint folder."""
    run_dir = workdir / "run"
    url = f"s3://{s3.name}/ckpt"
    sets = ("training.steps=6", "checkpoint.everySteps=100", f"checkpoint.path={url}")
    proc = grpojob_run(run_dir, *sets, cwd=workdir)
    wait_steps(run_dir, 2, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=180)
    done = len(read_records(run_dir / "metrics.jsonl"))
    assert proc.returncode != 0 and f"stopped: checkpoint {url}/step-{done:06d}" in out, out
    proc = grpojob_run(run_dir, *sets, cwd=workdir)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert f"resuming after step {done}" in out, out
    assert [r["step"] for r in read_records(run_dir / "metrics.jsonl")] == list(range(1, 7))
    assert not (run_dir / "checkpoints").exists() and not list(workdir.rglob("s3:*"))
