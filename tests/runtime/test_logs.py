"""The runtime processes' logs (grpojob.logs): a warning that keeps coming collapses into one line
with a count instead of one line each time."""
from __future__ import annotations

import logging

from grpojob import logs


def _record(msg: str, *args, level=logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("grpojob.trainer", level, __file__, 1, msg, args, None)


def test_a_repeated_warning_is_logged_once_then_with_a_count(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    f = logs.CollapseRepeats(every=60)
    template = "step %d: no trainable sequences (all groups filtered); no update"
    passed = []
    for step in range(1, 173):  # a saturated reward: the same warning every step, 1 s apart
        r = _record(template, step)
        if f.filter(r):
            passed.append(r.getMessage())
        clock[0] += 1
    assert passed[0] == "step 1: no trainable sequences (all groups filtered); no update"
    assert passed[1] == "step 61: no trainable sequences (all groups filtered); no update [59 more like this in the last 60 s]"
    assert len(passed) == 3
    assert f.filter(_record("another warning")) and f.filter(_record("the step failed", level=logging.ERROR))
    assert f.filter(_record("the step failed", level=logging.ERROR))  # errors are never held back
