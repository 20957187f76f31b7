"""A pytest plugin that writes each test's result the moment it is known, one JSON line each:

    python -m pytest -p tools.pytest_results --results=results.jsonl ...

{"event": "start", "test": ...} when a test begins, {"event": "result", "test", "outcome", "when",
"seconds", "error"} when it passed, failed (in setup, call or teardown) or was skipped. Under
xdist only the controller writes (workers' reports reach it as they finish). A run that hangs or
is killed keeps every result written before: `summarize` names the tests that started and never
finished, and puts each failure's text in a file of its own.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional


def pytest_addoption(parser) -> None:
    parser.addoption("--results", default=None, help="write each test's result to this JSON-lines file at once")


class _Writer:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a", buffering=1)  # line-buffered: each result is on disk at once

    def write(self, doc: dict) -> None:
        self.f.write(json.dumps({"time": round(time.time(), 3), **doc}) + "\n")
        self.f.flush()

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.write({"event": "start", "test": nodeid})

    def pytest_runtest_logreport(self, report) -> None:
        failed_elsewhere = report.when != "call" and report.outcome == "failed"
        if report.when == "call" or failed_elsewhere or (report.when == "setup" and report.skipped):
            error = None
            if report.outcome != "passed":
                error = report.longreprtext[-6000:] if report.longreprtext else None
            self.write({"event": "result", "test": report.nodeid, "outcome": report.outcome, "when": report.when,
                        "seconds": round(report.duration, 3), "error": error})


def pytest_configure(config) -> None:
    path = config.getoption("--results")
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_Writer(Path(path)), "grpojob-results-writer")


def read(path: Path) -> tuple[dict[str, dict], list[str]]:
    """(test -> its last result, tests that started and have no result)."""
    results: dict[str, dict] = {}
    started: list[str] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}, []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == "start":
            started.append(doc["test"])
        elif doc.get("event") == "result":
            prev = results.get(doc["test"])
            if prev is None or prev["outcome"] == "passed":  # a teardown failure after a pass counts
                results[doc["test"]] = doc
    return results, [t for t in dict.fromkeys(started) if t not in results]


def summarize(path: Path, failures: Optional[Path] = None) -> str:
    """One line: counts, and the tests that never finished; each failure's text into `failures`."""
    results, unfinished = read(path)
    count = {k: sum(r["outcome"] == k for r in results.values()) for k in ("passed", "failed", "skipped")}
    bad = [r for r in results.values() if r["outcome"] == "failed"]
    if failures is not None:
        failures.write_text("".join(f"=== {r['test']} ({r['when']}, {r['seconds']} s)\n{r['error']}\n\n"
                                    for r in bad) or "no failure\n")
    text = f"{count['passed']} passed, {count['failed']} failed, {count['skipped']} skipped"
    if bad:
        text += "; failed: " + ", ".join(r["test"].split("::")[-1] for r in bad)
    if unfinished:
        text += "; never finished: " + ", ".join(t.split("::")[-1] for t in unfinished)
    return text
