"""Processes started by the trainer tests, always cleaned up: torchrun starts its workers in
their own sessions, so a process group kill would orphan them; we kill the tree by pid."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> list[int]:
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, ppid in parents.items() if ppid == parent]
        out += kids
        todo += kids
    return out


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
