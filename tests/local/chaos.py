"""Faults injected into the real processes of a `grpojob run` (issue 42), and what each cost: the
tests in tests/local/test_chaos.py assert on an `Outcome`, benchmarks/chaos.py prints them.

A scenario starts the tiny job, waits until it has trained `after` steps (and, where it says so,
committed a checkpoint), injects its fault into one process found by its environment (its role,
replica, rank), and lets the run finish on its own. From metrics.jsonl, as written (every row,
replayed ones included), and the run's screen output it reads:

- steps lost: steps recorded before the fault and trained again after it (a trainer that resumed
  from its last checkpoint);
- rollouts lost: stream positions of the run's steps that no final step trained (the prompts
  buffered at a checkpoint must survive a trainer restart), and those trained twice;
- recovery: seconds from the fault to the first step recorded past the last one before it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from grpojob.local.progress import newest_checkpoint, read_records

from .test_run import EXAMPLE, ROOT, _stream_rows, grpojob_run, processes_of  # noqa: F401 (ROOT: for tests)

PROMPTS = 8  # prompts per step: half of examples/tiny-local.yaml's, for shorter steps


def find(run_dir: Path, **env: str) -> list[int]:
    """The live processes of the run whose environment has every NAME=value given."""
    want = [f"{k}={v}".encode() for k, v in env.items()]
    out = []
    for pid in processes_of(run_dir):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in environ for w in want):
            out.append(pid)
    return out


def rollout_server(run_dir: Path, index: int) -> int:
    (pid,) = find(run_dir, GRPOJOB_ROLE="rollout", GRPOJOB_REPLICA_ID=f"rollout-{index}")
    return pid


def judge(run_dir: Path, name: str) -> int:
    (pid,) = find(run_dir, GRPOJOB_ROLE="judge", GRPOJOB_JUDGE=name)
    return pid


def environment(run_dir: Path, name: str) -> int:
    (pid,) = find(run_dir, GRPOJOB_ROLE="environment", GRPOJOB_ENVIRONMENT=name)
    return pid


def trainer_rank(run_dir: Path, rank: int) -> int:
    """A rank started by torchrun (it alone has RANK; the launcher has the role too)."""
    (pid,) = find(run_dir, GRPOJOB_ROLE="trainer", RANK=str(rank))
    return pid


def rows(run_dir: Path) -> list[dict]:
    """Every step row of metrics.jsonl as written, a step trained again after a resume included."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:  # a line being written
            continue
        if r.get("kind") is None and "step" in r:
            out.append(r)
    return out


class Screen:
    """The run's screen output, read as it comes."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._thread.start()

    def text(self) -> str:
        self._thread.join(10)
        return "".join(self.lines)


@dataclass
class Outcome:
    fault: str
    returncode: int
    out: str
    before: list[dict]  # the rows written before the fault
    after: list[dict]  # the rows written after it
    final: list[dict]  # read_records: each step's last row
    recovery_seconds: Optional[float]
    checkpoint_at_fault: Optional[int]
    stream_rows: list[int] = field(default_factory=list)

    @property
    def steps_lost(self) -> int:
        done = max((r["step"] for r in self.before), default=0)
        again = [r["step"] for r in self.after if r["step"] <= done]
        return done - min(again) + 1 if again else 0

    @property
    def trained(self) -> list[int]:
        return [i for r in self.final for i in r["sample_ids"]]

    @property
    def rollouts_lost(self) -> int:
        return len(set(self.stream_rows) - set(self.trained))

    @property
    def trained_twice(self) -> int:
        return len(self.trained) - len(set(self.trained))

    def row(self) -> str:
        rec = "-" if self.recovery_seconds is None else f"{self.recovery_seconds:.1f}"
        return f"{self.fault:<40} {rec:>8} {self.steps_lost:>10} {self.rollouts_lost:>13}"

    def versions_by_step(self) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for r in self.before + self.after:
            out.setdefault(r["step"], set()).add(r["policy_version"])
        return out


def run_with_fault(workdir: Path, fault: str, inject: Callable[[Path], None], *sets: str, after: int = 3,
                   steps: int = 8, every: int = 3, need_checkpoint: bool = False, timeout: float = 400,
                   args: tuple[str, ...] = (), manifest: Path = EXAMPLE, prompts: Optional[int] = PROMPTS,
                   ready: Optional[Callable[[list[dict]], bool]] = None) -> Outcome:
    """The tiny job for `steps` steps (a checkpoint every `every`), `inject(run_dir)` once `after`
    steps are recorded (and a checkpoint committed, with need_checkpoint, and `ready(rows)` holds,
    with ready: a fault on a process that has not joined yet tests nothing); then to its end. Another
    `manifest` with `prompts` None: as it is written but for the checkpoint interval (its groups are
    no dataset stream: no prompt accounting)."""
    run_dir = workdir / "run"
    if prompts is None:
        sets = (f"checkpoint.everySteps={every}", *sets)
    else:
        sets = (f"training.steps={steps}", f"training.promptsPerStep={prompts}", f"checkpoint.everySteps={every}",
                "dataset.args.size=1000", *sets)  # one epoch: a row id is a stream position
    proc = grpojob_run(run_dir, *sets, cwd=workdir, args=args, example=manifest)
    screen = Screen(proc)
    deadline = time.monotonic() + timeout
    while True:
        written = rows(run_dir)
        ckpt = newest_checkpoint(run_dir / "checkpoints")
        if len(written) >= after and (ckpt is not None or not need_checkpoint) and (ready is None or ready(written)):
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{fault}: no step {after} to inject at (exit {proc.poll()}):\n{screen.text()}")
        time.sleep(0.2)
    before = rows(run_dir)
    ckpt = newest_checkpoint(run_dir / "checkpoints")
    at = time.monotonic()
    inject(run_dir)
    recovered = None
    last = max(r["step"] for r in before)
    while proc.poll() is None and time.monotonic() < deadline:
        if recovered is None and any(r["step"] > last for r in rows(run_dir)[len(before):]):
            recovered = time.monotonic() - at
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if recovered is None and any(r["step"] > last for r in rows(run_dir)[len(before):]):
        recovered = time.monotonic() - at  # within the last poll
    written = rows(run_dir)
    return Outcome(fault, proc.returncode, screen.text(), before, written[len(before):],
                   read_records(run_dir / "metrics.jsonl"), recovered,
                   int(ckpt.name.split("-")[1]) if ckpt else None,
                   _stream_rows(workdir, run_dir, steps * prompts) if prompts else [])


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    """Hung, not dead: SIGSTOP (the workdir fixture's SIGKILL ends it)."""
    os.kill(pid, signal.SIGSTOP)
