"""Structured logs for the runtime processes: JSON lines (GRPOJOB_LOG_FORMAT=json, the default in
pods) or plain text, on stderr. `extra={...}` fields become JSON keys."""
from __future__ import annotations

import json
import logging
import sys
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


def setup(fmt: str, tag: str = "", logger: Optional[str] = None) -> None:
    """Send `logger` (the root logger when None) to stderr in `fmt` (json|text); `tag` goes into
    each text line (e.g. "[rank 1]")."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s"
                                               + (f" {tag}" if tag else "") + ": %(message)s"))
    target = logging.getLogger(logger)
    target.handlers[:] = [handler]
    target.setLevel(logging.INFO)
    if logger is not None:
        target.propagate = False
