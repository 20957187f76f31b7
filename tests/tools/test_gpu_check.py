"""The GPU check (tools/gpu_check.py) and its per-test results (tools/pytest_results.py), on the CPU:
it says what it skipped, and a test session that hangs still reports every result it reached."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools import gpu_check
from tools.pytest_results import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_on_a_machine_without_cuda_it_says_what_it_skipped(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "skipped: no CUDA device is visible" in line]
    # the real-model job is listed as skipped where its model can be had, else as unavailable (not a failure)
    real = ["real-model"] if gpu_check._real_model_installed() else []
    assert [r.split()[0] for r in rows] == ["gpu-tests", "readme-job", *real, "throughput", "weight-sync",
                                            "generation", "modes"]
    if not real:
        assert any(line.split()[:2] == ["real-model", "unavailable"] for line in proc.stdout.splitlines())
    assert (tmp_path / "summary.txt").read_text().splitlines()[0].split()[:2] == ["part", "result"]
    assert "torch " in (tmp_path / "env.txt").read_text() and "pyproject: >=" in proc.stdout


def test_a_hanging_session_keeps_every_result_it_reached(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "import time, pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert 1 == 2, 'the failure text'\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skipped(): pass\n"
        "def test_hangs(): time.sleep(600)\n")
    results = tmp_path / "results.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.pytest_results",
                             f"--results={results}", "--rootdir", str(tmp_path), "-c", os.devnull,
                             str(tmp_path / "test_some.py")], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while "test_hangs" not in (results.read_text() if results.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # as a per-part time limit does to a hung session
    proc.wait(10)
    line = summarize(results, tmp_path / "failures.txt")
    assert line == "1 passed, 1 failed, 1 skipped; failed: test_fails; never finished: test_hangs"
    assert "the failure text" in (tmp_path / "failures.txt").read_text()
