"""A checkpoint's disk filling up during a save (issue #42): the save is dropped whole (its space
given back), the previous checkpoint stays and resumes, training goes on and says so; three failed
saves in a row stop the trainer with the path and the fix. A real full filesystem (a small tmpfs)."""
import io
import json

import pytest

from grpojob import checkpoint
from grpojob.checkpoint.manager import MAX_FAILED_SAVES
from grpojob.checkpoint.storage import StorageRefused
from grpojob.learner.errors import TrainerError
from grpojob.leader.build import build
from grpojob.leader.server import StatusBoard
from grpojob.local.progress import Progress

from tests.helpers.disk import remount_read_only, small_disk

from .conftest import make_job

# one checkpoint of the tiny model takes about 2.2 MiB (policy and Adam state, fp32): the first fits
DISK_KIB = 3 * 1024


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_full_disk_drops_the_save_keeps_the_last_checkpoint_and_training_goes_on(tiny_dir, tmp_path):
    with small_disk(tmp_path / "disk", DISK_KIB) as disk:
        ck = disk / "ck"
        job = make_job(tiny_dir, training={"steps": 3}, checkpoint={"everySteps": 1, "keepLast": 2})
        board = StatusBoard(3)
        run = build(job, checkpoint_dir=str(ck), run_dir=str(tmp_path / "run"), board=board)
        assert run.run() == "completed"
        # step 1's checkpoint is whole and the one a resume takes; nothing of the failed saves is left
        assert [s for s, _ in checkpoint.list_checkpoints(ck)] == [1]
        assert checkpoint.latest(ck).name == "step-000001"
        assert sorted(p.name for p in ck.iterdir()) == ["latest", "step-000001"]
        assert run.checkpoints.failed_in_a_row == 2 and run.checkpoints.last_step == 1
        # the final model is written (elsewhere) and the status says how the last save went
        assert (tmp_path / "run" / "final-model" / "config.json").exists()
        assert board.status.message.startswith("training completed; checkpoint of step 3 failed: No space left on "
                                                "device"), board.status.message
        records = _records(tmp_path / "run")
        assert [r["step"] for r in records] == [1, 2, 3]
        failed = [r["extra"].get("checkpoint_failed") for r in records]
        assert failed[0] is None and "No space left on device" in failed[2], failed
        assert failed[2].endswith("(the last checkpoint is step 1)"), failed[2]
        # what `grpojob run` prints for that step
        out = io.StringIO()
        shown = Progress(tmp_path / "shown.jsonl", 3, enabled=False, out=out)  # tails the file from here
        (tmp_path / "shown.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
        shown.update()
        assert "step 3: checkpoint of step 2 failed: No space left on device" in out.getvalue(), out.getvalue()
        # a resume from what is there starts after step 1
        again = build(job, checkpoint_dir=str(ck), run_dir=str(tmp_path / "run2"))
        assert again.trainer.step == 1


def test_saves_failing_three_times_in_a_row_stop_the_trainer_with_the_path_and_the_fix(tiny_dir, tmp_path):
    with small_disk(tmp_path / "disk", DISK_KIB) as disk:
        ck = disk / "ck"
        job = make_job(tiny_dir, training={"steps": 6}, checkpoint={"everySteps": 1, "keepLast": 2})
        run = build(job, checkpoint_dir=str(ck), run_dir=str(tmp_path / "run"))
        with pytest.raises(TrainerError) as e:
            run.run()
        said = str(e.value)
        assert f"{MAX_FAILED_SAVES} checkpoints in a row failed (the last saved: step 1)" in said, said
        assert f"free space under {ck}" in said and "spec.checkpoint.size" in said
        assert not isinstance(e.value, StorageRefused)  # space may come back: a restart is worth it
        assert [s for s, _ in checkpoint.list_checkpoints(ck)] == [1]


def test_a_volume_turned_read_only_mid_run_stops_the_trainer_for_good_with_the_mount_fix(tiny_dir, tmp_path):
    """Saves refused by a read-only filesystem fail the same at every restart: StorageRefused (the
    job's StartRefused, no restart), the read-only fix, and no "step None" before any save."""
    with small_disk(tmp_path / "disk", DISK_KIB) as disk:
        job = make_job(tiny_dir, training={"steps": 6}, checkpoint={"everySteps": 1})
        run = build(job, checkpoint_dir=str(disk / "ck"), run_dir=str(tmp_path / "run"))  # the probe passes
        remount_read_only(disk)
        with pytest.raises(StorageRefused) as e:
            run.run()
        said = str(e.value)
        assert said.startswith(f"{MAX_FAILED_SAVES} checkpoints in a row failed (the last saved: none yet in this "
                               "run); step 3: Read-only file system"), said
        assert "mounted read-only" in said and "free space" not in said and "None" not in said
