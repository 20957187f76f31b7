"""grpojob.lifeline and the runner's restart rule, fast: real processes, no model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpojob import failures
from grpojob.api import plugins
from grpojob.local.processes import Child
from grpojob.local.restarts import RestartPolicy, Restarts


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_dead(pid: int, seconds: float) -> float:
    t0 = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - t0 < seconds, f"process {pid} still alive after {seconds} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def _middle(tmp_path: Path, child_code: str) -> tuple[subprocess.Popen, int]:
    """A parent process that starts `child_code` (in a session of its own, as the runner does) and
    says its pid; the test then kills the parent with SIGKILL."""
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen({child_code}, start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    return parent, pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_through_the_lifeline_dies_with_its_parent(tmp_path):
    argv = f"[sys.executable, '-m', 'grpojob.lifeline', str(os.getpid()), '--', '/bin/sleep', '600']"
    parent, child = _middle(tmp_path, argv)
    time.sleep(0.5)  # the lifeline has exec'd sleep
    assert _alive(child) and Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"/bin/sleep")
    parent.kill()
    parent.wait()
    assert _wait_dead(child, 5) < 5


def test_a_process_watching_its_parent_stops_when_it_is_gone_and_is_ended_after_the_grace(tmp_path):
    log = tmp_path / "events"
    code = textwrap.dedent(f"""
        import time
        from grpojob import lifeline
        lifeline.watch_parent(lambda: open({str(log)!r}, "a").write("lost\\n"), grace=1.0, interval=0.05)
        time.sleep(600)  # a process that would not stop by itself
    """)
    parent, child = _middle(tmp_path, f"[sys.executable, '-c', {code!r}]")
    time.sleep(1.5)  # imports done, watching
    parent.kill()
    parent.wait()
    took = _wait_dead(child, 10)
    assert log.read_text() == "lost\n"
    assert 0.9 < took < 5  # ended by the grace deadline, not before on_lost ran


def test_restarts_back_off_exponentially_up_to_the_bound_and_count_afresh_after_a_long_run():
    policy = RestartPolicy(max_restarts=3, first_delay=1.0, max_delay=3.0, reset_after=600.0)
    r = Restarts(policy)
    child = Child("rollout-0", [], {}, Path("/nonexistent.log"), started_at=time.monotonic())
    assert [r.schedule(child) for _ in range(4)] == [1.0, 2.0, 3.0, None]  # doubling, capped, bounded
    assert r.ready() == []  # not due yet
    r.due["rollout-0"] = (time.monotonic() - 1, child)
    assert r.ready() == [child] and r.due == {}
    child.started_at = time.monotonic() - 601  # ran 10 minutes: a new series
    assert r.schedule(child) == 1.0


def test_a_childs_termination_message_and_last_error_are_read_back(tmp_path):
    child = Child("rollout-0", ["/bin/true"], dict(os.environ), tmp_path / "logs" / "rollout-0.log")
    child.start()
    assert child.proc.wait(10) == 0 and child.termination() is None
    child.termination_log.write_text(plugins.failure_message(plugins.ENGINE_FAILED, ["rollout server x: broke"]))
    assert child.termination() == (plugins.ENGINE_FAILED, "rollout server x: broke")
    child.log_path.write_text("\n".join([
        json.dumps({"time": "t", "level": "ERROR", "logger": "grpojob", "message": "first",
                    "exception": "Traceback ...\nRuntimeError: deep"}),
        json.dumps({"time": "t", "level": "INFO", "logger": "grpojob", "message": "after"})]) + "\n")
    assert child.last_error() == "first"
    assert child.tail().splitlines() == ["t ERROR grpojob: first [RuntimeError: deep]", "t INFO grpojob: after"]
    child.start()  # a restart clears the last termination message
    child.proc.wait(10)
    assert child.termination() is None
    assert os.environ.get(failures.ENV_TERMINATION_LOG) is None  # only the child's environment has it


def test_a_run_stops_at_once_on_a_plugin_failure_and_names_the_restart_bound(tmp_path):
    """The runner's decision about a child that exited (real processes that write their
    termination message and exit 1): a plug-in failure is final; an engine failure is restarted
    until the bound, then the run fails with the child's error and last lines."""
    import io

    from grpojob.local import runner

    from tests.helpers.jobs import job_from

    job = job_from({"model": {}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}],
                    "checkpoint": {"path": str(tmp_path / "ckpt")}}, tmp_path / "model")
    out = io.StringIO()
    run = runner.Run(job, tmp_path, None, progress=False, out=out, restarts=RestartPolicy(max_restarts=1))
    rollout = next(c for c in run.children if c.name == "rollout-0")

    def exits_with(reason: str, message: str) -> Child:
        rollout.argv = [sys.executable, "-c", f"import sys; from grpojob import failures; "
                                              f"failures.report({reason!r}, [{message!r}]); sys.exit(1)"]
        rollout.start()
        rollout.proc.wait(30)
        return rollout

    with pytest.raises(runner.RunError, match="PluginImportFailed: spec.rollout.backend: cannot import"):
        run._exited(exits_with(plugins.IMPORT_FAILED, "spec.rollout.backend: cannot import 'x'"))
    broke = exits_with(plugins.ENGINE_FAILED, "rollout server rollout-0: hf engine failed: boom")
    assert run._exited(broke) is False
    assert out.getvalue().startswith("rollout-0 exited with code 1: EngineFailed: rollout server rollout-0: hf "
                                     "engine failed: boom\n  restarting it in 1 s (restart 1 of 1")
    with pytest.raises(runner.RunError, match=r"(?s)hf engine failed: boom\nit was restarted 1 times.*last lines"):
        run._exited(broke)
