"""NexRL's remote-API trainer pattern, end to end on this machine: `grpojob run` starts a GRPOJob in
mode service (the trainer and a rollout server), and the example's remote trainer, a process of its
own pointed at the run's endpoints.json and token, samples the toy task through the service,
computes group-normalised advantages itself and trains with forward_backward(importance_sampling),
optim_step and save_weights_for_sampler: the toy reward rises. Ctrl-C then checkpoints and stops."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from grpojob.auth import Auth, read_file
from grpojob.local.progress import read_records
from grpojob.local.runner import ENDPOINTS_FILE, EXIT_INTERRUPTED, token_path

from tests.local.test_run import ROOT, processes_of, workdir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
EXAMPLE = ROOT / "examples" / "plugins" / "nexrl-remote"
STEPS = 60  # with transformers 5.24 30 steps reached +0.24..+0.26 now and then (CI failed so); 60 reach +0.46..+0.91


def test_the_remote_trainer_learns_the_toy_task_through_the_service(workdir, tiny_dir):  # noqa: F811
    run_dir = workdir / "run"
    service = subprocess.Popen([sys.executable, "-m", "grpojob", "run", str(EXAMPLE / "nexrl-remote.yaml"),
                                "--run-dir", str(run_dir), "--no-progress", "--set", f"model.path={tiny_dir}"],
                               cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / ENDPOINTS_FILE).exists():
            assert service.poll() is None and time.monotonic() < deadline, service.stdout.read()
            time.sleep(0.2)
        metrics = workdir / "remote.jsonl"
        loop = subprocess.run([sys.executable, str(EXAMPLE / "remote_trainer.py"), "--run-dir", str(run_dir),
                               "--steps", str(STEPS), "--metrics", str(metrics)],
                              cwd=workdir, capture_output=True, text=True, timeout=600)
        assert loop.returncode == 0, loop.stdout[-3000:] + loop.stderr[-3000:]
        records = read_records(metrics)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        assert [r["policy_version"] for r in records] == list(range(1, STEPS + 1))
        assert all(r["groups"] == 16 for r in records)
        first = sum(r["reward_mean"] for r in records[:3]) / 3
        last = sum(r["reward_mean"] for r in records[-3:]) / 3
        assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"

        endpoints = json.loads((run_dir / ENDPOINTS_FILE).read_text())
        headers = Auth(read_file(token_path(run_dir))).headers()
        with urllib.request.urlopen(urllib.request.Request(endpoints["trainer-0"] + "/status", headers=headers),
                                    timeout=10) as r:
            status = json.loads(r.read())
        ops = status["service"]["ops"]
        assert status["step"] == STEPS and status["policyVersion"] == STEPS and not (run_dir / "metrics.jsonl").exists()
        for op, calls in (("forward_backward", STEPS), ("optim_step", STEPS), ("save_weights_for_sampler", STEPS),
                          ("sample", STEPS * 16)):
            assert (ops[op]["calls"], ops[op]["refused"], ops[op]["failed"]) == (calls, 0, 0), (op, ops[op])
    finally:
        service.send_signal(signal.SIGINT)  # Ctrl-C: the trainer checkpoints and stops
        out, _ = service.communicate(timeout=120)
    assert service.returncode == EXIT_INTERRUPTED, out
    assert "training service at http://127.0.0.1:" in out and f"stopped: checkpoint {run_dir}/checkpoints/step-" \
        f"{STEPS:06d}" in out, out
    assert processes_of(run_dir) == []
