"""Waiting on a trainer's leader endpoint, for tests that run trainer processes (pods acted out,
GPU containers): nothing here needs the Kubernetes emulator."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from grpojob import auth


def wait_completed(port: int, token: str, procs: list[subprocess.Popen], logs: list, timeout: float = 420) -> dict:
    """The trainer's /status once it says "completed" (a completed trainer stays up until its pod
    is stopped); fails when a process dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [(p, log) for p, log in zip(procs, logs) if p.poll() is not None]
        assert not dead, f"exit {dead[0][0].poll()}:\n{dead[0][1].read_text()[-3000:]}"
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers=auth.Auth(token).headers())
            with urllib.request.urlopen(req, timeout=5) as r:
                doc = json.loads(r.read())
            if doc["phase"] == "completed":
                return doc
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"not completed in {timeout}s:\n{logs[0].read_text()[-3000:]}")
