"""`grpojob run` end to end: the real CLI starts the real trainer (torchrun) and rollout server
processes on this machine, as the README's command does."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from grpojob.local.progress import read_records

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-local.yaml"
pytestmark = pytest.mark.slow


def grpojob_run(run_dir: Path, *sets: str, cwd: Path, args: tuple[str, ...] = (),
                env: Optional[dict[str, str]] = None, example: Path = EXAMPLE) -> subprocess.Popen:
    argv = [sys.executable, "-m", "grpojob", "run", str(example), "--run-dir", str(run_dir), "--no-progress", *args]
    for s in sets:
        argv += ["--set", s]
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})


def processes_of(run_dir: Path) -> list[int]:
    """PIDs of every live process started for this run (they carry GRPOJOB_RUN_DIR)."""
    needle = f"GRPOJOB_RUN_DIR={run_dir}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if needle in env and state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_steps(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_records(run_dir / "metrics.jsonl")
        if len(records) >= n:
            return records
        if proc.poll() is not None:
            pytest.fail(f"run ended early ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.5)
    pytest.fail(f"fewer than {n} steps after {timeout}s")


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    for pid in processes_of(tmp_path / "run"):  # never leave a process behind, even on failure
        os.kill(pid, signal.SIGKILL)


def test_tiny_local_run_learns_with_generation_two_versions_ahead(workdir):
    """The README's command with fewer steps, rollouts running up to 2 policy versions ahead of
    training: the stale samples are corrected by importance weights and the reward still rises."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=60", "algorithm.maxStaleness=2", cwd=workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 61))
    first, last = records[0]["reward_mean"], max(r["reward_mean"] for r in records[-3:])
    assert last >= first + 0.5, f"reward {first:.3f} -> {last:.3f}"
    assert max(r["policy_staleness_max"] for r in records) == 2  # it did run ahead, within the bound
    assert any(abs(r["importance_weight_mean"] - 1) > 1e-4 for r in records)
    assert "building a tiny random model" in out and "done: 60 steps" in out
    assert (run_dir / "final-model" / "config.json").exists()
    assert (run_dir / "reward.png").stat().st_size > 1000
    assert processes_of(run_dir) == []


def test_pushes_every_other_step_finish_and_runs_are_reproducible(workdir):
    """weightSync.everySteps 2 at maxStaleness 0 used to hang at step 2 (the rollouts were asked for
    a version never pushed). And the same manifest and seed give the same steps, metric for metric
    (with a push every step: when two steps' generations overlap, as at everySteps 2, the engine's
    batches depend on timing and so do the last bits of its logits; see docs/pipeline.md)."""
    runs = {}
    for name, sets in (("every-2", ("weightSync.everySteps=2", "training.steps=10")),
                       ("a", ("training.steps=6",)), ("b", ("training.steps=6",))):
        proc = grpojob_run(workdir / name, *sets, cwd=workdir)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
        runs[name] = read_records(workdir / name / "metrics.jsonl")
    every2 = runs["every-2"]
    assert [r["step"] for r in every2] == list(range(1, 11))
    assert [r["policy_staleness_max"] for r in every2] == [0, 1] * 5  # the version pushed every other step
    a, b = runs["a"], runs["b"]
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 7))
    for ra, rb in zip(a, b):
        assert ra["sample_ids"] == rb["sample_ids"] and ra["completions"] == rb["completions"]
        for key in ("reward_mean", "reward_std", "completion_length_mean", "advantage_std", "loss", "grad_norm",
                    "entropy", "importance_weight_mean"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["step"], key)


def test_interrupt_checkpoints_and_resume_trains_each_prompt_once(workdir):
    """Ctrl-C mid-run with generation running ahead (maxStaleness 1): the checkpoint holds the data
    position and the prompts generated but not trained; after the resume every prompt of the
    stream's first 12 steps is trained exactly once."""
    run_dir = workdir / "run"
    sets = ("training.steps=12", "checkpoint.everySteps=100", "algorithm.maxStaleness=1",
            "dataset.args.size=1000")  # one epoch: row ids are stream positions
    proc = grpojob_run(run_dir, *sets, cwd=workdir)
    wait_steps(run_dir, 3, proc)
    token = _token_is_only_in_its_file(run_dir)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0, out
    assert "checkpoint" in out and "step-" in out, out
    done = [r["step"] for r in read_records(run_dir / "metrics.jsonl")]
    assert processes_of(run_dir) == []

    proc = grpojob_run(run_dir, *sets, cwd=workdir)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13)), f"steps after resume (before: {done})"
    assert f"resuming after step {len(done)}" in out
    trained = [i for r in records for i in r["sample_ids"]]
    assert len(trained) == len(set(trained)) == 12 * 16, "a prompt was trained twice"
    assert set(trained) == set(_stream_rows(workdir, run_dir, 12 * 16)), "a prompt was skipped"
    assert (run_dir / "token").read_text().strip() == token, "a resumed run keeps its token"


def _token_is_only_in_its_file(run_dir: Path) -> str:
    """The run's token (issue 15): a 0600 file in the run dir, named by GRPOJOB_TOKEN_FILE in every
    process's environment; the token itself in no environment, config, log or endpoints file; the
    trainer's /status refuses a request without it."""
    path = run_dir / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    pids = processes_of(run_dir)
    assert len(pids) >= 2
    for pid in pids:
        env = Path(f"/proc/{pid}/environ").read_bytes()
        assert f"GRPOJOB_TOKEN_FILE={path}".encode() in env and token.encode() not in env
    for f in [run_dir / "grpojob.json", run_dir / "endpoints.json", *(run_dir / "logs").iterdir()]:
        assert token not in f.read_text(), f
    trainer = json.loads((run_dir / "endpoints.json").read_text())["trainer-0"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(trainer + "/status", timeout=5)
    assert e.value.code == 401
    req = urllib.request.Request(trainer + "/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200
    return token


def _stream_rows(workdir: Path, run_dir: Path, n: int) -> list[int]:
    """The dataset rows of the job's first n stream positions (its seeded order)."""
    from transformers import AutoTokenizer

    from grpojob.api import parse
    from grpojob.data import PromptSettings, PromptStream

    job = parse(json.loads((run_dir / "grpojob.json").read_text()))
    stream = PromptStream(PromptSettings.of(job.spec), AutoTokenizer.from_pretrained(job.spec.model.path))
    return [s.index for s in stream.take(n)]


def test_a_dead_child_takes_the_run_down_cleanly_without_restarts(workdir):
    """--max-restarts 0: the first death stops the run (tests/local/test_failures.py: restarts)."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=200", cwd=workdir, args=("--max-restarts", "0"))
    wait_steps(run_dir, 1, proc)
    rollout = [p for p in processes_of(run_dir)
               if b"GRPOJOB_ROLE=rollout" in Path(f"/proc/{p}/environ").read_bytes().split(b"\0")]
    assert rollout, "no rollout server process found"
    os.kill(min(rollout), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "rollout-0 exited with code -9 (Killed)" in out and "last lines" in out, out
    deadline = time.monotonic() + 15
    while processes_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(run_dir) == []


def test_greedy_baseline_workflow_runs_end_to_end(workdir):
    """ReMax through the real servers: the greedy completion is generated, scored and used."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=3", "rollout.workflow=greedy-baseline", cwd=workdir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert [r["step"] for r in read_records(run_dir / "metrics.jsonl")] == [1, 2, 3]


def test_two_trainer_ranks_share_the_rollout_servers(workdir):
    """processesPerReplica 2: torchrun starts 2 gloo ranks; rank 0 drives the rollout servers for
    the whole batch and hands each rank its share."""
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=3", "trainer.processesPerReplica=2", "rollout.replicas=2",
                       cwd=workdir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["groups"] == 16 for r in records), records[-1]  # the global batch, both ranks' shares
    assert "trainer 1 x 2" in out and "2 x hf rollout" in out
    # The completed trainer waited to be stopped (as in a pod) and `grpojob run` asked it: both ranks
    # left together, torchrun exited by itself (not by a signal: SIGTERM makes it raise)
    log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert "SignalException" not in log and "suspend requested over HTTP" in log, log[-3000:]
