"""How a runtime process that cannot load the job's user code says so, where the operator looks.

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
    if TERMINATION_LOG.exists():  # in a pod (a local run has none: its errors come from `grpojob run`)
        try:
            TERMINATION_LOG.write_bytes(text.encode()[:_MAX_BYTES])
        except OSError as e:
            log.warning("cannot write the termination message %s: %s", TERMINATION_LOG, e)
    return text
