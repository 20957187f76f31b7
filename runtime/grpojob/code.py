"""`grpojob install-code`: spec.code.pip into GRPOJOB_SITE_DIR, once, before the job's processes
start (an init container in each pod; `grpojob run` into the run directory).

Why a step of its own rather than in `grpojob trainer`: torchrun starts several trainer ranks per
pod and they would all install at once; an init container runs once per pod, before the trainer
or rollout server starts, so a failed install shows as the pod's init failure with pip's own
words in its termination message (the operator fails the job with reason PluginInstallFailed)
rather than as a crash loop of the main process. The directory is an emptyDir on PYTHONPATH: the
root filesystem stays read-only. A marker records what was installed, so a restarted pod (or a
resumed local run) with the same requirements does not install again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Callable, Optional

from grpojob.api import FieldError, GRPOJob, plugins
from grpojob.api.operations import CodeSpec
from grpojob import config, failures
from grpojob.plan import ENV_SITE_DIR, Placement, code_env

MARKER = ".grpojob-requirements.json"
FIELD = "spec.code.pip"


class InstallError(RuntimeError):
    pass


def pip_command(c: CodeSpec, target: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-input",
            "--disable-pip-version-check", "--no-warn-script-location", *c.pip_args, *c.pip]


def install(c: CodeSpec, target: Path, echo: Callable[[str], None] = print) -> bool:
    """Install spec.code.pip into `target`; False when it already holds exactly these. InstallError
    (with pip's last lines) when pip fails."""
    wanted = json.dumps({"pip": c.pip, "pipArgs": c.pip_args})
    marker = target / MARKER
    if marker.exists() and marker.read_text() == wanted:
        echo(f"{FIELD}: already installed in {target}")
        return False
    target.mkdir(parents=True, exist_ok=True)
    cmd = pip_command(c, target)
    echo(f"{FIELD}: installing {' '.join(c.pip)} into {target}")
    tail: deque[str] = deque(maxlen=15)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:  # pip's progress, as it comes
        line = line.rstrip()
        tail.append(line)
        echo(line)
    if proc.wait() != 0:
        raise InstallError(f"pip install failed (exit {proc.returncode}): " + " | ".join(x for x in tail if x))
    marker.write_text(wanted)
    return True


def main(args=None) -> int:
    job = config.load(resolve_plugins=False)
    target = os.environ.get(ENV_SITE_DIR)
    if not target:
        print(f"grpojob install-code: {ENV_SITE_DIR} is not set (the plan sets it when spec.code.pip is)",
              file=sys.stderr)
        return 2
    try:
        install(job.spec.code, Path(target), echo=lambda s: print(s, flush=True))
    except InstallError as e:
        failures.report(plugins.INSTALL_FAILED, [FieldError(FIELD, str(e))])
        return 1
    return 0


def use_locally(job: GRPOJob, site_dir: Optional[Path] = None) -> dict[str, str]:
    """Make spec.code.localPath (and an installed site dir) importable in this process, as the
    plan's environment does for the processes it starts; returns that environment."""
    where = Placement(trainer_host="127.0.0.1", config_path="", checkpoint_dir="", run_dir="",
                      code_dir=str(Path(job.spec.code.local_path).resolve()) if job.spec.code.local_path else None,
                      site_dir=str(site_dir) if site_dir else None)
    env = code_env(job, where)
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    if plugins.CODE_DIR_ENV in env:
        os.environ[plugins.CODE_DIR_ENV] = env[plugins.CODE_DIR_ENV]
    return env
