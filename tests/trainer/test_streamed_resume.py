"""A job that streams its dataset from a real S3 API (moto's server on 127.0.0.1), is stopped
mid-epoch (checkpoint and suspend) and resumed by a new trainer: it trains on exactly the rows a
straight run trains on, so no row is trained twice in an epoch and none is skipped."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpojob.leader.build import build
from grpojob.leader.rollouts import GroupSource
from tests.helpers.jobs import job_from
from tests.helpers.s3 import parquet, s3, s3_server  # noqa: F401 - fixtures

from .conftest import BASE

pytestmark = pytest.mark.slow

CATEGORIES = ("animals", "colors", "numbers")
# 40 rows of the toy task, each with its own id
ROWS = [{"prompt": f"{CATEGORIES[i % 3]} please :", "answer": CATEGORIES[i % 3], "id": i} for i in range(40)]


def _sample_ids(run_dir: Path) -> list[list[int]]:
    return [json.loads(line)["sample_ids"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def trained_rows(monkeypatch) -> list[list[int]]:
    """The `id` of every row each step trains on, as the trainer receives the step's groups."""
    seen: list[list[int]] = []
    take = GroupSource.next_step

    def recording(self, stop=None):
        step = take(self, stop)
        if step is not None:
            seen.append([g.sample.row["id"] for g in step.groups])
        return step

    monkeypatch.setattr(GroupSource, "next_step", recording)
    return seen


def test_a_streamed_s3_dataset_resumes_mid_epoch_without_training_a_row_twice(s3, tiny_dir, tmp_path, trained_rows):
    path = s3.put("toy/train.parquet", parquet(ROWS, row_group_size=8))
    # one request at a time: the stream's order, not timing, decides which rows each step gets
    base = {**BASE, "dataset": {"path": path, "streaming": True, "shuffleBuffer": 8, "maxPromptLength": 32}}
    over = dict(training={"steps": 6, "promptsPerStep": 4}, algorithm={"name": "grpo", "groupSize": 4},
                weightSync={"everySteps": 1}, checkpoint={"everySteps": 100})
    straight = build(job_from(base, tiny_dir, **over), checkpoint_dir=str(tmp_path / "a"), run_dir=str(tmp_path / "ra"))
    assert straight.run() == "completed"
    want = _sample_ids(tmp_path / "ra")
    assert len(want) == 6 and all(len(ids) == 4 for ids in want)
    assert trained_rows == want  # a sample's index is its row's place in the file
    trained_rows.clear()

    first = build(job_from(base, tiny_dir, **over), checkpoint_dir=str(tmp_path / "b"), run_dir=str(tmp_path / "rb"),
                  on_step=lambda r: r.step == 3 and first.request_suspend())
    assert first.run() == "suspended"
    second = build(job_from(base, tiny_dir, **over), checkpoint_dir=str(tmp_path / "b"), run_dir=str(tmp_path / "rb"))
    assert second.resumed_from is not None and second.trainer.step == 3
    assert second.run() == "completed"
    got = _sample_ids(tmp_path / "rb")  # the first run's 3 steps, then the resumed run's 3
    assert got == want and trained_rows == want, "the resumed run trains on the rows the straight run did, in its order"
    trained = [i for ids in trained_rows for i in ids]
    assert len(trained) == 24 and len(set(trained)) == 24, "a row trained twice within the epoch"
    assert trained != sorted(trained)  # the seeded buffer shuffled them
