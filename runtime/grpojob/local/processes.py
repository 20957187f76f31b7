"""Child processes of a local run: started in their own process groups (so a whole torchrun tree
can be signalled) through grpojob.lifeline (they get SIGTERM when the runner dies, even by
SIGKILL), logs to files, a tail of those logs and the termination message (grpojob.failures) for
error messages."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from grpojob import failures


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
    log_path: Optional[Path]  # None: this process's stdout and stderr (a pod's container log)
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)
    started_at: float = 0.0  # time.monotonic() of the last start
    # Where it leaves its termination message; default: next to its log file, or, with neither,
    # this process's own (a pod's /dev/termination-log, left as the kubelet made it).
    termination_path: Optional[Path] = None
    log_start: int = 0  # the log's size when it was last started: what this start wrote comes after

    @property
    def termination_log(self) -> Optional[Path]:
        """Where the process leaves its termination message (the kubelet's terminationMessagePath)."""
        if self.termination_path is not None or self.log_path is None:
            return self.termination_path
        return self.log_path.with_suffix(".termination")

    def start(self) -> None:
        """Start (or start again: the log is appended to). Call it from the main thread only: the
        parent-death signal fires when the thread that forked the child ends."""
        env = dict(self.env)
        if self.termination_log is not None:
            self.termination_log.parent.mkdir(parents=True, exist_ok=True)
            self.termination_log.unlink(missing_ok=True)
            env[failures.ENV_TERMINATION_LOG] = str(self.termination_log)
        argv = [sys.executable, "-m", "grpojob.lifeline", str(os.getpid()), "--", *self.argv]
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")
            self.log_start = log.tell()
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if log is not None:
            log.close()
        self.started_at = time.monotonic()

    def termination(self) -> Optional[tuple[str, str]]:
        """(reason, message) the process wrote before it exited, or None."""
        return failures.read(self.termination_log) if self.termination_log is not None else None

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

    def _own_lines(self, tail_bytes: Optional[int] = None) -> Optional[list[str]]:
        """The log's lines without torchrun's closing report (None: no log)."""
        if self.log_path is None:  # its output went to this process's own
            return None
        try:
            with open(self.log_path, "rb") as f:
                if tail_bytes is not None:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        return own_lines(text.rstrip().splitlines())

    def tail(self, lines: int = 12) -> str:
        """The last lines the process itself wrote (torchrun's closing report left out: they end
        with the rank's own traceback), led by its last error when that is further up."""
        own = self._own_lines()
        if own is None:
            return "(no log)"
        errors = [ln for ln in own if _is_error(ln)]
        last = list(deque(own, maxlen=lines))
        if errors and errors[-1] not in last:
            last = [errors[-1], "...", *last]
        shown = [_readable(ln)[:2000] for ln in last]
        return "\n".join(shown[:-1] + _traceback_end(last[-1], shown[-1]))

    def rank_failures(self) -> list[str]:
        """torchrun's own word on the ranks that failed (its glog lines: "failed (exitcode: -9)
        local_rank: 0"): a rank killed outright leaves no error of its own to show."""
        if self.log_path is None:
            return []
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self.log_start, f.seek(0, os.SEEK_END) - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        out = []
        # its summary lists every failed rank; its one-line report names only the one whose
        # failure it timed first, which can be a peer's error on the killed rank's broken connection
        found = [(c, r) for r, c in _RANK_SUMMARY.findall(text)] + _RANK_FAILED.findall(text)
        for code, rank in found:
            code = int(code)
            how = f"killed by signal {-code} ({signal.strsignal(-code)})" if code < 0 else f"exited with code {code}"
            if f"local rank {rank} {how}" not in out:
                out.append(f"local rank {rank} {how}")
        return out

    def last_error(self) -> Optional[str]:
        """The last error the process logged, in one line (a JSON log line's message), or None."""
        lines = self._own_lines(256 * 1024)
        line = next((ln for ln in reversed(lines or []) if _is_error(ln)), None)
        if line is None:
            return None
        try:
            line = json.loads(line)["message"]
        except (ValueError, KeyError, TypeError):
            pass
        return line if len(line) <= 400 else line[:400] + " ..."


_GLOG_ERROR = re.compile(r"^E\d{4} ")  # torchrun's own errors (a rank that died), glog style
_GLOG = re.compile(r"^[EWIF]\d{4} \d\d:\d\d:\d\d")  # any line of torchrun's own (glog style)
_RANK_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_RANK_SUMMARY = re.compile(r"\(local_rank: (\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")  # ChildFailedError's table
_LAUNCHER_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def own_lines(lines: list[str]) -> list[str]:
    """A torchrun log without the launcher's closing report: its glog lines after the rank's last
    words, its own traceback ending in ChildFailedError, and the "Root Cause ... error_file ... To
    enable traceback see" box. That report only says a rank failed; the rank's traceback above it
    says why, so the CLI's last lines must be the rank's."""
    end = len(lines)
    failed = next((i for i in range(end - 1, -1, -1) if lines[i].startswith(_LAUNCHER_FAILED)), None)
    if failed is not None:
        start = next((i for i in range(failed, -1, -1) if lines[i].startswith("Traceback (most recent call last)")),
                     failed)
        end = start
    while end > 0 and (_GLOG.match(lines[end - 1]) or not lines[end - 1].strip()):
        end -= 1
    return lines[:end] if end > 0 else lines


def _is_error(line: str) -> bool:
    return '"level": "ERROR"' in line or " ERROR " in line or bool(_GLOG_ERROR.match(line))


def _traceback_end(line: str, shown: str, frames: int = 8) -> list[str]:
    """The log's last line as shown, and, when it is a JSON error line with a traceback, that
    traceback's last lines under it (a text log has them as lines of its own already)."""
    try:
        exception = str(json.loads(line).get("exception") or "") if line.startswith("{") else ""
    except (ValueError, AttributeError):
        exception = ""
    if not exception.strip():
        return [shown]
    return [shown.rsplit(" [", 1)[0], *("  " + ln for ln in exception.rstrip().splitlines()[-frames:])]


def _readable(line: str) -> str:
    """A JSON log line (grpojob.logs) as text, a traceback by its last line."""
    if not line.startswith("{"):
        return line
    try:
        doc = json.loads(line)
        text = f"{doc['time']} {doc['level']} {doc['logger']}: {doc['message']}"
    except (ValueError, KeyError, TypeError):
        return line
    if doc.get("exception"):
        text += f" [{str(doc['exception']).strip().splitlines()[-1]}]"
    return text


def signal_all(children: list[Child], now: Callable[[Child], bool] = lambda c: False) -> None:
    """SIGTERM every child at once (SIGINT those `now` names: stop at once, e.g. a rollout server's
    drain is for a scale-down, not for the end of the run)."""
    for c in children:
        c.signal(signal.SIGINT if now(c) else signal.SIGTERM)


def stop_all(children: list[Child], grace: float, now: Callable[[Child], bool] = lambda c: False) -> None:
    """signal_all, then SIGKILL (with their trees) those still running after `grace` seconds."""
    signal_all(children, now)
    deadline = time.monotonic() + grace
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.proc.wait(timeout=10)


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
