"""How a runtime process says why it ended, where the operator (and `grpojob run`) look: the
kubelet's termination message (user code that cannot load; a broken engine; a trainer that finished).

A plug-in that does not import (or pip requirements that do not install) will fail the same way on
every restart: the process writes the reason and the field-path errors to the kubelet's
termination message (the operator reads it from the pod's status and fails the job with that
reason, instead of letting the pod crash-loop) and to its log, then exits 1. A rollout server whose
engine broke writes plugins.ENGINE_FAILED the same way and exits 1: not the job's failure, the
pod is restarted and the operator records the message in an Event.

`grpojob run` points each process at a file of its own (GRPOJOB_TERMINATION_LOG) and reads it
when the process exits, as the kubelet reads terminationMessagePath.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional, Sequence

from grpojob.api import FieldError, InvalidSpec, plugins

log = logging.getLogger("grpojob")

TERMINATION_LOG = Path("/dev/termination-log")  # the kubelet's default terminationMessagePath
ENV_TERMINATION_LOG = "GRPOJOB_TERMINATION_LOG"  # another path (grpojob run: one file per process)
_MAX_BYTES = 4096  # the kubelet keeps at most 4 KiB of a termination message


class PluginError(InvalidSpec):
    """Plug-ins of the job that cannot be imported here, with their field paths."""

    reason = plugins.IMPORT_FAILED


def report(reason: str, errors: Sequence[FieldError | str]) -> str:
    """Log the failure and leave it as the container's termination message; returns the message."""
    text = plugins.failure_message(reason, [str(e) for e in errors])
    log.error("%s: %s", reason, "; ".join(str(e) for e in errors))
    write_termination_message(text)
    return text


def report_completed(step: int, total: int) -> str:
    """A trainer that reached training.steps says so in its termination message, written as soon as
    it finished: however its container ends later (scaled down, evicted, killed), the operator reads
    the completion from the pod's status even if it never saw /status say "completed"."""
    text = plugins.completion_message(step, total)
    write_termination_message(text)
    return text


def write_termination_message(text: str, first: bool = False) -> None:
    """`text` as the container's termination message: in a pod, or where GRPOJOB_TERMINATION_LOG
    says (`grpojob run` gives each child one); a bare process elsewhere has none. `first`: only
    if none was written yet (a trainer rank other than 0: its failure is often rank 0's echo)."""
    named = os.environ.get(ENV_TERMINATION_LOG)
    path = Path(named) if named else TERMINATION_LOG
    if named or path.exists():
        try:
            if first and path.exists() and path.stat().st_size > 0:
                return
            path.write_bytes(text.encode()[:_MAX_BYTES])
        except OSError as e:
            log.warning("cannot write the termination message %s: %s", path, e)


def describe(e: BaseException) -> str:
    """An exception as its type and message, on one line: what the CLI and the pod show."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def report_exception(e: BaseException, *, permanent: bool, rank: int = 0, running: str = "trainer") -> str:
    """A failed process's own exception as its termination message: plugins.START_REFUSED when a
    restart would fail the same way (the run and the job stop at once), else plugins.TRAINER_FAILED
    (restarted). Rank 0 writes it; another rank only when nothing was written yet."""
    reason = plugins.START_REFUSED if permanent else plugins.TRAINER_FAILED
    text = plugins.failure_message(reason, [f"{running} rank {rank}: {describe(e)}" if running == "trainer"
                                            else f"{running}: {describe(e)}"])
    write_termination_message(text, first=rank != 0)
    return text


def read(path: Path) -> Optional[tuple[str, str]]:
    """(reason, message) of the termination message in `path`, or None."""
    try:
        return plugins.parse_message(path.read_text(errors="replace"))
    except OSError:
        return None
