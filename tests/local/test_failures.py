"""Failure is loud and fast (issue 21): `grpojob run` with a rollout engine that breaks (tests/local/
faulty_engines.py, plugged in as user code), a stalled engine, and a runner killed outright. The
user sees the engine's error and an exit code within seconds, or the run recovers; no process is
left behind."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from grpojob.local.progress import newest_checkpoint, read_records

from . import faulty_engines
from .test_run import grpojob_run, processes_of, wait_steps, workdir  # noqa: F401 - workdir is a fixture

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone
ENGINES = Path(faulty_engines.__file__)


def engine(name: str) -> str:
    return f"rollout.backend={ENGINES}:{name}"


class Output:
    """The run's screen output, read as it comes, with when each line came."""

    def __init__(self, proc):
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line))

    def first(self, text: str) -> float:
        return next(t for t, line in self.lines if text in line)

    def text(self) -> str:
        self._thread.join(10)
        return "".join(line for _, line in self.lines)


def wait_gone(run_dir: Path, seconds: float) -> float:
    """Seconds until no process of the run is left (fails after `seconds`)."""
    t0 = time.monotonic()
    while processes_of(run_dir):
        assert time.monotonic() - t0 < seconds, f"still running after {seconds} s: {processes_of(run_dir)}"
        time.sleep(0.2)
    return time.monotonic() - t0


def test_an_engine_failing_at_every_start_stops_the_run_with_its_error(workdir):
    """(a) Restarted with back-off up to the bound, then the run exits 1 with the engine's error and
    the server's last log lines, within 30 s of the first failure."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=3", engine("FailsAlways"), cwd=workdir, args=("--max-restarts", "1"))
    out = Output(proc)
    proc.wait(timeout=300)
    ended = time.monotonic()
    text = out.text()
    assert proc.returncode == 1, text
    failure = f"rollout-0 exited with code 1: EngineFailed: rollout server rollout-0: hf engine failed: " \
              f"RuntimeError: {faulty_engines.ERROR}"
    first = out.first(failure)
    assert "restarting it in 1 s (restart 1 of 1" in text  # the restart: the same failure again
    assert text.count(failure) == 2, text
    assert "it was restarted 1 times in a row (--max-restarts)" in text and "last lines:" in text
    assert ended - first < 30, f"{ended - first:.1f} s from the first failure to the exit"
    print(f"first failure on screen -> exit: {ended - first:.1f} s")
    assert wait_gone(run_dir, 10) < 10


def test_an_engine_failing_once_mid_run_is_restarted_and_training_finishes(workdir):
    """(b) The rollout server dies a few steps in; it is restarted, the trainer says which server
    failed and why meanwhile, and the run completes every step."""
    run_dir = workdir / "run"
    marker = workdir / "engine-failed-once"
    proc = grpojob_run(run_dir, "training.steps=8", engine("FailsOnce"), cwd=workdir,
                       env={faulty_engines.ENV_MARKER: str(marker)})
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert marker.exists()
    assert f"rollout-0 exited with code 1: EngineFailed: rollout server rollout-0: hf engine failed: " \
           f"RuntimeError: {faulty_engines.ERROR}" in out and "restarting it in 1 s (restart 1 of 3" in out
    assert [r["step"] for r in read_records(run_dir / "metrics.jsonl")] == list(range(1, 9))
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert f"fails: HTTP 503: hf engine failed: RuntimeError: {faulty_engines.ERROR}" in trainer_log
    assert wait_gone(run_dir, 10) < 10


def test_sigkill_of_grpojob_run_leaves_no_process_and_the_trainer_checkpoints(workdir):
    """(d) The runner killed outright: its children get SIGTERM from the kernel (lifeline), the
    trainer checkpoints the step it is at, nothing is left running."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=500", "checkpoint.everySteps=1000", cwd=workdir)
    done = len(wait_steps(run_dir, 3, proc))
    assert len(processes_of(run_dir)) >= 3  # torchrun, its rank, the rollout server
    os.kill(proc.pid, signal.SIGKILL)  # the runner alone (its children are in sessions of their own)
    proc.wait(10)
    print(f"SIGKILL -> no process left: {wait_gone(run_dir, 15):.1f} s")
    ckpt = newest_checkpoint(run_dir / "checkpoints")
    assert ckpt is not None and int(ckpt.name.split("-")[1]) >= done, (ckpt, done)


def test_ctrl_c_stops_a_stalled_run_within_10_s(workdir):
    """(e) Generation hangs: the trainer's /status says what the step waits for; Ctrl-C gives the
    step up, checkpoints the last finished one and stops everything within 10 s."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=5", engine("Stalls"), cwd=workdir)
    trainer = None
    deadline = time.monotonic() + 240
    message = ""
    while "waits for its groups" not in message:
        assert time.monotonic() < deadline and proc.poll() is None, f"no wait reported: {message!r}"
        time.sleep(1)
        if trainer is None and (run_dir / "endpoints.json").exists():
            trainer = json.loads((run_dir / "endpoints.json").read_text())["trainer-0"]
        message = _status(trainer, run_dir).get("message", "") if trainer else ""
    assert message.startswith("step 1 waits for its groups: 16 group(s)"), message
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, out
    assert took < 10, f"Ctrl-C took {took:.1f} s\n{out}"
    print(f"Ctrl-C -> exit: {took:.1f} s")
    assert "stopped: checkpoint" in out and "step-000000" in out, out
    assert wait_gone(run_dir, 5) < 5


def _status(base: str, run_dir: Path) -> dict:
    token = (run_dir / "token").read_text().strip()
    req = urllib.request.Request(base + "/status", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return {}
