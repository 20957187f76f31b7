"""The failing process's own error, where the user looks (issue 30): `grpojob run` prints the
exception's last line and the log's path (not torchrun's "failed (exitcode: 1)" boilerplate), the
process leaves the same text as its termination message (GRPOJOB_TERMINATION_LOG here; in a pod
the kubelet's /dev/termination-log, which the operator reads from the pod's status), a failure a
restart cannot change stops the run at once, and one that can is restarted."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grpojob.api import plugins
from grpojob.local.progress import read_records

from . import faulty_engines
from .test_failures import wait_gone
from .test_run import EXAMPLE, workdir  # noqa: F401 - workdir is a fixture

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone
TRAINERS = Path(__file__).with_name("faulty_trainers.py")


def _run(workdir: Path, edit, *args: str, timeout: float = 300) -> tuple[int, str, float]:
    """`grpojob run` of the README's example edited by `edit(spec)`: (exit code, screen, seconds)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    edit(doc["spec"])
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "grpojob", "run", str(path), "--run-dir", str(workdir / "run"), "--no-progress",
            *args]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def termination(workdir: Path, child: str) -> str:
    return (workdir / "run" / "logs" / f"{child}.termination").read_text()


def test_a_dataset_the_trainer_cannot_read_stops_the_run_at_once_with_its_error(workdir):
    def edit(spec):
        spec["dataset"] = {"path": str(workdir / "missing.jsonl"), "maxPromptLength": 32}
    code, out, seconds = _run(workdir, edit)
    assert code == 1, out
    said = termination(workdir, "trainer-0")
    assert said.startswith(plugins.START_REFUSED + "\ntrainer rank 0: DatasetError: ") and "missing.jsonl" in said
    assert f"trainer-0 exited with code 1: {plugins.START_REFUSED}: trainer rank 0: DatasetError: " in out, out
    assert "restarting it" not in out and "exitcode" not in out and "elastic" not in out, out
    assert f"log: {workdir / 'run' / 'logs' / 'trainer-0.log'}" in out
    print(f"refused in {seconds:.1f} s")
    assert wait_gone(workdir / "run", 10) < 10


def test_a_spec_the_trainer_refuses_at_start_is_a_trainer_error_shown_at_once(workdir):
    def edit(spec):
        spec["trainer"] = {"class": f"{TRAINERS}:RefusesItsArgs", "args": {"warmup_steps": "ten"}}
    code, out, _ = _run(workdir, edit)
    assert code == 1, out
    refused = f"{plugins.START_REFUSED}: trainer rank 0: TrainerError: spec.trainer.args.warmup_steps: must be an " \
              f"integer, not 'ten'"
    assert f"trainer-0 exited with code 1: {refused}" in out, out
    assert termination(workdir, "trainer-0").replace("\n", ": ", 1).startswith(refused)
    assert "restarting it" not in out and "exitcode" not in out


def test_an_engine_whose_package_is_missing_stops_the_run_without_retrying(workdir):
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here: its absence cannot be shown")
    except ImportError:
        pass
    code, out, _ = _run(workdir, lambda spec: None, "--backend", "vllm")
    assert code == 1, out
    assert f"rollout-0 exited with code 1: {plugins.START_REFUSED}: rollout server rollout-0: the vllm engine " \
           f"failed to start: ModuleNotFoundError" in out, out
    assert "restarting it" not in out


def test_an_engine_whose_every_generate_raises_turns_unready_and_ends_the_run(workdir):
    """Before: 8,044 tracebacks in the rollout log, the trainer waiting 30 minutes, nothing on screen."""
    def edit(spec):
        spec["rollout"]["backend"] = f"{faulty_engines.__file__}:RaisesOnGenerate"
        spec["training"]["steps"] = 3
    code, out, seconds = _run(workdir, edit, "--max-restarts", "1")
    assert code == 1, out
    broken = f"rollout-0 exited with code 1: EngineFailed: rollout server rollout-0: the engine's generate failed"
    assert out.count(broken) == 2 and f"RuntimeError: {faulty_engines.ERROR}" in out, out  # first run, restart
    assert "it was restarted 1 times in a row" in out
    assert seconds < 120, f"{seconds:.0f} s"
    trainer_log = (workdir / "run" / "logs" / "trainer-0.log").read_text()
    assert f"HTTP 500: the RaisesOnGenerate engine's generate failed: RuntimeError: {faulty_engines.ERROR}" \
        in trainer_log or f"generate failed: RuntimeError: {faulty_engines.ERROR}" in trainer_log
    assert "JSONDecodeError" not in trainer_log
    rollout_log = (workdir / "run" / "logs" / "rollout-0.log").read_text()
    assert rollout_log.count("Traceback") <= 4, "one traceback per streak, not one per request"


def test_a_trainer_that_crashes_mid_run_is_restarted_with_its_error_on_screen_and_finishes(workdir):
    marker = workdir / "crashed-once"

    def edit(spec):
        spec["trainer"] = {"class": f"{TRAINERS}:CrashesOnceAtStep3", "args": {"marker": str(marker)}}
        spec["training"]["steps"] = 5
        spec["checkpoint"]["everySteps"] = 1
    code, out, _ = _run(workdir, edit)
    assert code == 0, out
    assert marker.exists()
    assert f"trainer-0 exited with code 1: {plugins.TRAINER_FAILED}: trainer rank 0: RuntimeError: " \
           f"injected: trainer crash at step 3" in out, out
    assert "restarting it in 1 s (restart 1 of 3" in out
    assert [r["step"] for r in read_records(workdir / "run" / "metrics.jsonl")][-1] == 5


def test_a_trainer_failing_at_every_start_ends_the_screen_with_its_own_traceback(workdir):
    """The last lines printed are the end of the trainer's own traceback, not torchrun's report
    ("Root Cause ... error_file ... To enable traceback see", issue 43)."""
    def edit(spec):
        spec["trainer"] = {"class": f"{TRAINERS}:CrashesAtEveryStep1"}
        spec["training"]["steps"] = 3
    code, out, _ = _run(workdir, edit, "--max-restarts", "0")
    assert code == 1, out
    assert "last lines:" in out, out
    last = out.rstrip().splitlines()[-1]
    assert last.rstrip("]").endswith("RuntimeError: injected: trainer crash at every step 1"), out
    after = out[out.index("last lines:"):]
    for launcher in ("Root Cause", "error_file", "To enable traceback see", "ChildFailedError"):
        assert launcher not in after, out
    assert "Root Cause" in (workdir / "run" / "logs" / "trainer-0.log").read_text()  # it was there to leave out
