"""Structured logs for the runtime processes: JSON lines (GRPOJOB_LOG_FORMAT=json, the default in
pods) or plain text, on stderr. `extra={...}` fields become JSON keys."""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Optional

_RECORD_FIELDS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        doc.update({k: v for k, v in record.__dict__.items() if k not in _RECORD_FIELDS})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class CollapseRepeats(logging.Filter):
    """A warning that keeps coming (same logger, level and message template: "step %d: no trainable
    sequences ...") is logged the first time, then at most once every `every` seconds, saying how
    many like it were held back meanwhile: a saturated reward once wrote 172 identical lines."""

    def __init__(self, every: float = 60.0):
        super().__init__()
        self.every = every
        self._seen: dict[tuple, list] = {}  # key -> [when last let through, held back since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.every:
            seen[1] += 1
            return False
        held = seen[1] if seen is not None else 0
        self._seen[key] = [now, 0]
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {now - seen[0]:.0f} s]"
        return True


def setup(fmt: str, tag: str = "", logger: Optional[str] = None) -> None:
    """Send `logger` (the root logger when None) to stderr in `fmt` (json|text); `tag` goes into
    each text line (e.g. "[rank 1]")."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s"
                                               + (f" {tag}" if tag else "") + ": %(message)s"))
    handler.addFilter(CollapseRepeats())
    target = logging.getLogger(logger)
    target.handlers[:] = [handler]
    target.setLevel(logging.INFO)
    if logger is not None:
        target.propagate = False
