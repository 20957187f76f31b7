"""The README's first command, as a newcomer runs it: a clean clone of the committed tree, a fresh
venv, the command read from README.md (never a copy of it) with a shorter run. pip resolves the
newest versions pyproject allows, as it does for a user: on 2026-11-24 this broke (transformers
5.24 changed a private protocol the hf engine implemented) while the suite, on CI's older set,
stayed green.

Under CI the README's command has already run so, on CI's own fresh clone: `.ci/run` runs its install
words for the newest set's venv, then its `grpojob run` with this test's steps before the test tools go
in, and names that run in GRPOJOB_CI_README_RUN; the test asserts on it rather than install that venv
a second time (about 160 s of CI's 2 cores)."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from grpojob.local.progress import read_records
from tools.dependency_sets import readme_command

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40

pytestmark = pytest.mark.slow


def _run_it(tmp_path) -> tuple[int, str, Path]:
    """A clean clone, the README's command in a fresh environment: (exit code, output, run dir)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    command = readme_command(clone / "README.md")
    run = f"{command} --set training.steps={STEPS} --no-progress --run-dir runs/readme"
    # Nothing of this process's environment leaks in: no active venv, no source tree on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not os.environ.get("VIRTUAL_ENV") or not p.startswith(os.environ["VIRTUAL_ENV"]))
    proc = subprocess.run(["bash", "-c", run], cwd=clone, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1500)
    return proc.returncode, f"{shlex.quote(run)} exited {proc.returncode}:\n{proc.stdout[-6000:]}", \
        clone / "runs" / "readme"


def test_the_readme_first_command_installs_runs_and_learns(tmp_path):
    ran = os.environ.get("GRPOJOB_CI_README_RUN")
    if ran:  # .ci/run ran it (see the module's doc): its exit code, its output and its run dir
        ran = Path(ran)
        code = int((ran / "rc").read_text())
        tail = f"the README's command under .ci/run exited {code}:\n{(ran / 'output.log').read_text()[-6000:]}"
        run_dir = ran / "run"
    else:
        code, tail, run_dir = _run_it(tmp_path)
    assert code == 0, tail
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), tail
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + 0.2, f"reward {first:.3f} -> {last:.3f} over {STEPS} steps"
