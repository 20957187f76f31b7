"""The trainer pod's first process, `grpojob torchrun` (the plan's trainer command): SIGTERM, which
the kubelet sends to that process only, goes to the ranks, so a trainer stopped after its job is
done (the operator's scale-down to 0) exits 0, and one stopped mid-run checkpoints and exits 0.
torchrun itself exits 1 on SIGTERM whatever its ranks do (issue 42: `0/1 Error` after Succeeded)."""
from __future__ import annotations

import json
import signal
import time

import pytest

from grpojob import checkpoint
from grpojob.plan import trainer_command

from .conftest import make_job
from .test_main import _env, _records, _wait_status

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone


def _sigterm_pid1(proc) -> float:
    """SIGTERM to the launcher alone (not its ranks), as the kubelet signals a container's PID 1."""
    proc.p.send_signal(signal.SIGTERM)
    return time.monotonic()


def test_a_completed_trainer_stopped_by_sigterm_exits_0(tiny_dir, tmp_path, procs):
    job = make_job(tiny_dir, training={"steps": 2}, trainer={"processesPerReplica": 2})
    env, port = _env(job, tmp_path)
    proc = procs(trainer_command(), env, tmp_path / "trainer.log")
    done = _wait_status(port, env, proc, lambda d: d["phase"] == "completed")
    assert done["step"] == 2
    asked = _sigterm_pid1(proc)
    assert proc.wait(30) == 0, proc.tail()
    assert time.monotonic() - asked < 15, "a completed trainer stops at once"
    log = proc.log.read_text()
    assert "SignalException" not in log and "SIGTERM: passed to the trainer ranks" in log, proc.tail()


def test_a_trainer_stopped_by_sigterm_mid_run_checkpoints_and_exits_0(tiny_dir, tmp_path, procs):
    job = make_job(tiny_dir, training={"steps": 400}, checkpoint={"everySteps": 1000})
    env, port = _env(job, tmp_path)
    proc = procs(trainer_command(), env, tmp_path / "trainer.log")
    _wait_status(port, env, proc, lambda d: d["phase"] == "running" and d["step"] >= 2)
    _sigterm_pid1(proc)
    assert proc.wait(120) == 0, proc.tail()
    stopped = len(_records(tmp_path))
    assert 2 <= stopped < 400
    assert checkpoint.latest(tmp_path / "ck").name == f"step-{stopped:06d}"
    said = [json.loads(x)["message"] for x in proc.log.read_text().splitlines() if x.startswith("{")]
    assert any(m.startswith("SIGTERM: finishing the step") for m in said), said
