"""Child processes of a local run: started in their own process groups (so a whole torchrun tree
can be signalled), logs to files, and a tail of those logs for error messages."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (torchrun starts its ranks in sessions of their own, so
    signalling its process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


_given: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port to listen on, free now. Chosen below the kernel's ephemeral range: a port from bind(0)
    lies inside it, and any outgoing connection made before the listener starts (a TCPStore client,
    an HTTP request) may take it as its source port (EADDRINUSE at random). Never the same port twice
    in one process, so the ports of one run differ even before they are bound."""
    low, _ = _ephemeral_range()
    first = 10000 if low > 12000 else 1024
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(first, low) if low > first + 100 else rng.randrange(1024, 65535)
        if port in _given or not _bindable(port):
            continue
        _given.add(port)
        return port
    raise OSError("no free TCP port below the ephemeral range")


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):  # servers listen on either
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


@dataclass
class Child:
    name: str  # e.g. trainer-0, rollout-1
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> Optional[int]:
        return self.proc.poll() if self.proc else None

    def signal(self, sig: int) -> None:
        """Signal the child's whole process group (torchrun and its ranks alike)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> Optional[int]:
        """SIGTERM, then SIGKILL after `grace` seconds; reap the group's leader."""
        if not self.proc:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL the child, its process group and every descendant (ranks in other sessions)."""
        if not self.proc:
            return
        tree = descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def tail(self, lines: int = 12) -> str:
        """The last lines of the log, led by the last error the process logged (under torchrun the
        real error sits above the launcher's own report)."""
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        all_lines = text.rstrip().splitlines()
        errors = [ln for ln in all_lines if '"level": "ERROR"' in ln or " ERROR " in ln]
        last = list(deque(all_lines, maxlen=lines))
        if errors and errors[-1] not in last:
            last = [errors[-1][:2000], "...", *last]
        return "\n".join(last)


def wait_any(children: list[Child], timeout: float) -> Optional[Child]:
    """The first child that has exited within `timeout` seconds, or None."""
    deadline = time.monotonic() + timeout
    while True:
        for c in children:
            if c.poll() is not None:
                return c
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
