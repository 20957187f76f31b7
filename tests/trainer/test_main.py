"""`grpojob trainer` as the plan starts it: torchrun, the env-var contract, the leader endpoint;
suspend over HTTP and by SIGTERM (checkpoint, exit 0), resume, completion (held until asked to
stop), a restart after completion, and failure."""
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grpojob import auth, checkpoint
from grpojob.plan import CONFIG_FILE, Placement, render_config, roles

from .conftest import make_job
from .procs import free_port

pytestmark = pytest.mark.serial  # its slow tests are timing-sensitive: CI runs them alone


def _env(job, tmp: Path) -> tuple[dict, int]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / CONFIG_FILE).write_text(render_config(job))
    port = free_port()
    where = Placement(trainer_host="127.0.0.1", config_path=str(tmp / CONFIG_FILE),
                      checkpoint_dir=str(tmp / "ck"), run_dir=str(tmp), rendezvous_port=free_port(),
                      sync_port=free_port(), trainer_port=port, token_file=str(auth.ensure_file(tmp / "token")))
    trainer = next(r for r in roles(job, where) if r.name == "trainer")
    env = {**os.environ, **trainer.env, "PET_NODE_RANK": "0", "OMP_NUM_THREADS": "1",
           "GRPOJOB_LOG_FORMAT": "json", "GRPOJOB_ROLLOUT_SOURCE": "inprocess"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env, port


def _bearer(env) -> dict:
    return auth.Auth.from_env(env).headers()


def _status(port, env):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers=_bearer(env))
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _wait_status(port, env, proc, pred, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.p.poll() is None, f"trainer exited early:\n{proc.tail()}"
        try:
            doc = _status(port, env)
            if pred(doc):
                return doc
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail(f"status condition not met in {timeout}s:\n{proc.tail()}")


def _records(tmp):
    return [json.loads(x) for x in (tmp / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_suspend_over_http_then_sigterm_then_resume_to_completion(tiny_dir, tmp_path, procs):
    job = make_job(tiny_dir, training={"steps": 400}, checkpoint={"everySteps": 1000})
    env, port = _env(job, tmp_path)
    cmd = roles(job, Placement("h", "c", "k", "r", token_file="t"))[0].command  # the plan's command
    first = procs(cmd, env, tmp_path / "first.log")
    _wait_status(port, env, first, lambda d: d["phase"] == "running" and d["step"] >= 2)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "grpojob_trainer_total_steps 400.0" in text and 'grpojob_stage_seconds_count{stage="train"}' in text
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/suspend", method="POST", data=b"",
                                                  headers=_bearer(env)), timeout=5).close()
    assert first.wait() == 0, first.tail()
    stopped = len(_records(tmp_path))
    assert 2 <= stopped < 400
    assert checkpoint.latest(tmp_path / "ck").name == f"step-{stopped:06d}"

    # SIGTERM (what Kubernetes sends) to a lone process: same checkpoint-then-stop; it resumes first
    second = procs([sys.executable, "-m", "grpojob", "trainer"], env, tmp_path / "second.log")
    _wait_status(port, env, second, lambda d: d["step"] >= stopped + 2)
    second.p.send_signal(signal.SIGTERM)
    assert second.wait() == 0, second.tail()
    steps = [r["step"] for r in _records(tmp_path)]
    assert steps == list(range(1, len(steps) + 1)), "resume must continue the step count"
    assert checkpoint.latest(tmp_path / "ck").name == f"step-{len(steps):06d}"
    assert '"message": "SIGTERM' in second.log.read_text()  # structured (json) logs

    # finish: a job with fewer steps left resumes and completes, writing the final model; then it
    # stays up saying so (a StatefulSet would restart it, had it exited) until asked to stop
    short = make_job(tiny_dir, training={"steps": len(steps) + 2}, checkpoint={"everySteps": 1000})
    (tmp_path / CONFIG_FILE).write_text(render_config(short))
    third = procs(cmd, env, tmp_path / "third.log")
    done = _wait_status(port, env, third, lambda d: d["phase"] == "completed")
    assert done["step"] == len(steps) + 2 and done["weightsInSync"] is True  # the last step pushed too
    assert [r["step"] for r in _records(tmp_path)][-2:] == [len(steps) + 1, len(steps) + 2]
    assert (tmp_path / "final-model" / "model.safetensors").is_file()
    time.sleep(2)
    assert third.p.poll() is None, "a completed trainer exited on its own"
    # POST /suspend (or SIGTERM) ends it: every rank exits 0, so torchrun does too
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/suspend", method="POST", data=b"",
                                                  headers=_bearer(env)), timeout=5).close()
    assert third.wait(30) == 0, third.tail()

    # restarted anyway (the kubelet restarts a container that exits 0): completed at once, from the
    # final checkpoint, nothing trained or saved again; SIGTERM ends it at once with exit 0
    final = checkpoint.latest(tmp_path / "ck")
    saved = final.stat().st_mtime_ns
    fourth = procs([sys.executable, "-m", "grpojob", "trainer"], env, tmp_path / "fourth.log")
    assert _wait_status(port, env, fourth, lambda d: d["phase"] == "completed")["step"] == len(steps) + 2
    fourth.p.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    assert fourth.wait(30) == 0, fourth.tail()
    assert time.monotonic() - asked < 10
    assert len(_records(tmp_path)) == len(steps) + 2
    assert checkpoint.latest(tmp_path / "ck") == final and final.stat().st_mtime_ns == saved


def test_bad_model_path_fails_with_the_field_named(tiny_dir, tmp_path, procs):
    job = make_job(tmp_path / "no-model-here")
    env, _ = _env(job, tmp_path)
    p = procs([sys.executable, "-m", "grpojob", "trainer"], env, tmp_path / "bad.log")
    assert p.wait() != 0
    lines = [json.loads(x) for x in p.log.read_text().splitlines() if x.startswith("{")]
    failure = [x for x in lines if x["level"] == "ERROR"]
    assert len(failure) == 1 and "spec.model.path" in failure[0]["message"] and "exception" not in failure[0]


def test_a_trainer_without_the_jobs_token_refuses_to_start(tiny_dir, tmp_path, procs):
    env, _ = _env(make_job(tiny_dir), tmp_path)
    env.pop(auth.ENV_TOKEN_FILE)
    p = procs([sys.executable, "-m", "grpojob", "trainer"], env, tmp_path / "no-token.log")
    assert p.wait() != 0
    lines = [json.loads(x) for x in p.log.read_text().splitlines() if x.startswith("{")]
    failure = [x for x in lines if x["level"] == "ERROR"]
    assert len(failure) == 1 and f"{auth.ENV_TOKEN_FILE} is not set" in failure[0]["message"]
    assert "exception" not in failure[0]


def test_a_checkpoint_directory_the_trainer_cannot_write_is_StartRefused_at_its_start(tiny_dir, tmp_path, procs):
    """A file where the checkpoint directory should be (a real EEXIST from mkdir): the probe write at start
    fails the same at every start, so the termination message says StartRefused (the operator
    fails the job instead of restarting the pod) with the fix, before any step."""
    from grpojob import failures
    from grpojob.api import plugins

    env, _ = _env(make_job(tiny_dir), tmp_path)
    (tmp_path / "ck").write_text("a file, not the checkpoint volume")
    env[failures.ENV_TERMINATION_LOG] = str(tmp_path / "termination")
    p = procs([sys.executable, "-m", "grpojob", "trainer"], env, tmp_path / "ro.log")
    assert p.wait() != 0
    said = (tmp_path / "termination").read_text()
    assert said.startswith(plugins.START_REFUSED), said
    assert "spec.checkpoint.path: the trainer cannot write checkpoints under" in said and "File exists" in said
    assert "mount the checkpoint volume at spec.checkpoint.path" in said
    assert not (tmp_path / "metrics.jsonl").exists()
