"""Processes started by the trainer tests, always cleaned up: torchrun starts its workers in
their own sessions, so a process group kill would orphan them; we kill the tree by pid."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from grpojob.local.processes import descendants, free_port  # noqa: F401 - re-exported

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, cmd: list[str], env: dict, log: Path):
        self.log = log
        self.f = open(log, "w")
        self.p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=self.f, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text()[-n:]

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.p.args} did not exit in {timeout}s:\n{self.tail()}")

    def kill(self) -> None:
        for pid in [*descendants(self.p.pid), self.p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait(10)
        self.f.close()
