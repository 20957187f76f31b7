"""How a trainer ends, for a StatefulSet that restarts every container that exits (restartPolicy
Always, https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#pod-template):
the final step publishes (the rollouts end on the final policy), "completed" is said in /status and
in the termination message, a completed trainer holds until asked to stop, and a completed trainer
that is restarted anyway says "completed" again without training."""
import threading
import time

from grpojob import checkpoint, failures
from grpojob.api import plugins
from grpojob.leader.build import build
from grpojob.leader.server import StatusBoard

from .conftest import make_job


def test_a_finished_run_says_completed_with_the_final_weights_published(tiny_dir, tmp_path, monkeypatch):
    log = tmp_path / "termination-log"  # the kubelet's /dev/termination-log, as a pod has it
    log.write_text("")
    monkeypatch.setattr(failures, "TERMINATION_LOG", log)
    job = make_job(tiny_dir, training={"steps": 2}, weightSync={"everySteps": 5})
    board = StatusBoard(2)
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"), board=board)
    assert run.run() == "completed"
    st = board.snapshot()
    # everySteps 5 > 2 steps: only the push after the last step reached the rollouts
    assert (st["phase"], st["step"], st["policyVersion"]) == ("completed", 2, 2)
    assert st["weightsInSync"] is True and st["rollouts"] == [{"replica": "in-process", "version": 2, "lag": 0}]
    assert plugins.parse_completion(log.read_text()) == 2
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()

    # Restarted after completing (the kubelet restarts a container that exits): it resumes from the
    # final checkpoint, trains nothing and says "completed" again, at once.
    log.write_text("")
    again = StatusBoard(2)
    second = build(job, checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"), board=again)
    assert second.trainer.step == 2
    saved = checkpoint.latest(tmp_path / "ck").stat().st_mtime_ns
    assert second.run() == "completed"
    assert again.snapshot()["phase"] == "completed" and again.snapshot()["step"] == 2
    assert again.snapshot()["weightsInSync"] is True  # the resume pushed the final policy again
    assert (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() == records, "it trained again"
    assert checkpoint.latest(tmp_path / "ck").stat().st_mtime_ns == saved, "it checkpointed again"
    assert plugins.parse_completion(log.read_text()) == 2


def test_a_completed_trainer_holds_until_asked_to_stop(tiny_dir, tmp_path):
    job = make_job(tiny_dir, training={"steps": 1})
    stop = threading.Event()
    board = StatusBoard(1)
    run = build(job, checkpoint_dir=str(tmp_path / "ck"), board=board, suspend=stop)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("phase", run.run(hold=True)))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while board.snapshot()["phase"] != "completed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert board.snapshot()["phase"] == "completed"
        time.sleep(1.5)  # more than one of its looks at the stop flag
        assert thread.is_alive() and "phase" not in result, "a completed trainer must not exit on its own"
        saved = checkpoint.latest(tmp_path / "ck").stat().st_mtime_ns
        asked = time.monotonic()
        stop.set()  # SIGTERM's handler or POST /suspend
        thread.join(10)
        assert not thread.is_alive() and result["phase"] == "completed"
        assert time.monotonic() - asked < 3, "stopping a completed trainer must be prompt"
        assert checkpoint.latest(tmp_path / "ck").stat().st_mtime_ns == saved, "nothing left to save"
    finally:
        stop.set()
        thread.join(30)
