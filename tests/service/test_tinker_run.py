"""The real tinker SDK against `grpojob run` (examples/plugins/tinker): the GRPOJob in mode service
runs in processes of its own (the trainer, a rollout server), and the example's Tinker loop, a
process of its own pointed at the run's endpoints.json and token (tml-<token>), learns the toy task
through Tinker's wire; Ctrl-C then checkpoints and stops the job."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from grpojob.local.progress import read_records
from grpojob.local.runner import ENDPOINTS_FILE, EXIT_INTERRUPTED

from tests.local.test_run import ROOT, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "plugins" / "tinker"
STEPS = 60  # at the loop's learning rate of 3e-3: 0.10-0.13 -> 0.99 over runs


def test_a_tinker_loop_learns_against_grpojob_run(workdir, tiny_sharp_dir):  # noqa: F811
    run_dir = workdir / "run"
    job = subprocess.Popen([sys.executable, "-m", "grpojob", "run", str(EXAMPLE / "tinker-lora.yaml"),
                            "--run-dir", str(run_dir), "--no-progress", "--set", f"model.path={tiny_sharp_dir}"],
                           cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / ENDPOINTS_FILE).exists():
            assert job.poll() is None and time.monotonic() < deadline, job.stdout.read()
            time.sleep(0.2)
        metrics = workdir / "tinker.jsonl"
        loop = subprocess.run([sys.executable, str(EXAMPLE / "tinker_loop.py"), "--run-dir", str(run_dir),
                               "--steps", str(STEPS), "--metrics", str(metrics)],
                              cwd=workdir, capture_output=True, text=True, timeout=600)
        assert loop.returncode == 0, loop.stdout[-3000:] + loop.stderr[-3000:]
        records = read_records(metrics)
        assert [r["policy_version"] for r in records] == list(range(1, STEPS + 1))
        first = sum(r["reward_mean"] for r in records[:3]) / 3
        last = sum(r["reward_mean"] for r in records[-3:]) / 3
        print(f"tinker_loop.py against grpojob run: reward {first:.3f} -> {last:.3f} in {STEPS} steps")
        assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
    finally:
        job.send_signal(signal.SIGINT)  # Ctrl-C: the trainer checkpoints and stops
        out, _ = job.communicate(timeout=120)
    assert job.returncode == EXIT_INTERRUPTED, out
    assert f"stopped: checkpoint {run_dir}/checkpoints/step-{STEPS:06d}" in out, out
    assert processes_of(run_dir) == []
