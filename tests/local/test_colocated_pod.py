"""`grpojob colocated-pod`, the one container of a colocated trainer pod with GPUs (grpojob.colocated_pod):
what the kubelet did for two containers it does for two processes. Its real run (training to the end
in a sandboxed pod) is tests/operator_k8s/test_colocated_sandbox.py; here, how it ends when one of
its processes does. The trainer is the real one (torchrun and the job's config); the engine is a
stand-in process that exits the way a broken engine does, named so below."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from grpojob import auth, failures, plan
from grpojob.api import plugins
from grpojob.local.processes import descendants, free_port
from tests.rollout.harness import make_job

pytestmark = pytest.mark.slow


def container(tmp_path: Path, model_dir: Path, engine_command: Optional[list[str]], config: str = "job.json",
              **over) -> tuple[subprocess.Popen, int, str]:
    """The container's process as the operator renders it (plan.one_container), run here: (it, the
    trainer's HTTP port, the job's token). `engine_command`: a stand-in engine; None: the real one."""
    trainer_port = free_port()
    job = make_job(model_dir, placement="colocated", trainer={"replicas": 1, "port": trainer_port},
                   rollout={"replicas": 1, "port": free_port()}, **over)
    (tmp_path / "job.json").write_text(plan.render_config(job))
    where = plan.Placement(trainer_host="127.0.0.1", config_path=str(tmp_path / config),
                           checkpoint_dir=str(tmp_path / "ckpt"), run_dir=str(tmp_path / "run"),
                           rendezvous_port=free_port(), sync_port=free_port(),
                           token_file=str(auth.ensure_file(tmp_path / "token")))
    trainer, engine = plan.roles(job, where)[:2]
    role = plan.one_container(trainer, engine)
    doc = json.loads(role.env[plan.ENV_COLOCATED_ENGINE])
    if engine_command is not None:
        doc["command"] = engine_command  # the stand-in engine
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # torchrun, as in the image
    env = {**os.environ, "PATH": path, **role.env, plan.ENV_COLOCATED_ENGINE: json.dumps(doc), "PET_NODE_RANK": "0",
           failures.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"), "TMPDIR": str(tmp_path)}
    (tmp_path / "termination-log").write_text("")
    proc = subprocess.Popen([sys.executable, "-m", "grpojob", *role.command[1:]], env=env,
                            stdout=open(tmp_path / "log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, trainer_port, auth.read_file(Path(where.token_file))


def _ended(proc: subprocess.Popen, tmp_path: Path, timeout: float = 120) -> int:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running after {timeout}s:\n{(tmp_path / 'log').read_text()[-3000:]}")
    return code


def no_process_left(tmp_path: Path) -> None:
    """Nothing of the container's trainer (torchrun, its rank) runs on after it ended."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [p for p in os.listdir("/proc") if p.isdigit() and _mentions(p, str(tmp_path))]
        if not left:
            return
        time.sleep(0.5)
    pytest.fail(f"processes left: {left}")


def _mentions(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_an_engine_that_dies_fails_the_container_with_its_reason(tmp_path, tiny_dir):
    """The stand-in engine exits 3 without a word: the container's termination message says
    EngineFailed with the exit code (the operator's Event), the trainer is stopped, exit 1."""
    proc, _, _ = container(tmp_path, tiny_dir, [sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(3)"])
    assert _ended(proc, tmp_path) == 1
    said = failures.read(tmp_path / "termination-log")
    assert said is not None and said[0] == plugins.ENGINE_FAILED and "exited with code 3" in said[1]
    assert plugins.parse_engine_failure((tmp_path / "termination-log").read_text()) is not None
    no_process_left(tmp_path)


def test_an_engine_failure_message_becomes_the_containers(tmp_path, tiny_dir):
    """A rollout server whose engine broke writes EngineFailed with its error to its own termination
    log (as in a container of its own); the one container passes it on verbatim."""
    write = ("import os; from grpojob.api import plugins; open(os.environ['GRPOJOB_TERMINATION_LOG'], 'w')"
             ".write(plugins.failure_message(plugins.ENGINE_FAILED, ['rollout server x: CUDA out of memory']));"
             " raise SystemExit(1)")
    proc, _, _ = container(tmp_path, tiny_dir, [sys.executable, "-c", write])
    assert _ended(proc, tmp_path) == 1
    text = (tmp_path / "termination-log").read_text()
    assert plugins.parse_engine_failure(text) == "rollout server x: CUDA out of memory"
    no_process_left(tmp_path)


def test_a_trainer_that_ends_ends_the_container_with_its_code(tmp_path, tiny_dir):
    """The trainer cannot read its config (a missing file): it exits non-zero, the engine (a
    stand-in that would run for 10 minutes) is stopped, and the container exits with the trainer's code."""
    proc, _, _ = container(tmp_path, tiny_dir, [sys.executable, "-c", "import time; time.sleep(600)"], config="missing.json")
    code = _ended(proc, tmp_path)
    assert code not in (0, None)
    log = (tmp_path / "log").read_text()
    assert f"the trainer exited with code {code}" in log
    no_process_left(tmp_path)
    assert not descendants(proc.pid)
