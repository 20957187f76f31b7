"""How a runtime process says why it ended, where the operator looks: the kubelet's termination
message (user code that cannot load; a trainer that finished).

A plug-in that does not import (or pip requirements that do not install) will fail the same way on
every restart: the process writes the reason and the field-path errors to the kubelet's
termination message (the operator reads it from the pod's status and fails the job with that
reason, instead of letting the pod crash-loop) and to its log, then exits 1.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from .api import FieldError, InvalidSpec, plugins

log = logging.getLogger("grpojob")

TERMINATION_LOG = Path("/dev/termination-log")  # the kubelet's default terminationMessagePath
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


def write_termination_message(text: str) -> None:
    """`text` as the container's termination message (in a pod; a local run has no such file)."""
    if TERMINATION_LOG.exists():
        try:
            TERMINATION_LOG.write_bytes(text.encode()[:_MAX_BYTES])
        except OSError as e:
            log.warning("cannot write the termination message %s: %s", TERMINATION_LOG, e)
