"""The last lines `grpojob run` prints of a failed process are its own (issue 43): under torchrun,
the rank's traceback, not the launcher's closing report ("Root Cause ... error_file ... To enable
traceback see ..."). A real torchrun runs a rank that logs and raises, as the trainer does."""
from __future__ import annotations

import os
import sys

from grpojob.local.processes import Child

RANK = """
import logging, sys
from grpojob import logs
logs.setup(sys.argv[1], tag="[rank 0]", logger="grpojob")
try:
    raise RuntimeError("the rank's own last words")
except RuntimeError:
    logging.getLogger("grpojob").error("trainer failed: RuntimeError: the rank's own last words", exc_info=True)
    sys.exit(1)  # as grpojob.trainer.main: logged with its traceback, then exit 1
"""


def _failed_torchrun(tmp_path, fmt: str) -> Child:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    child = Child("trainer-0", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                                "--master-port", "0", str(script), fmt],
                  {**os.environ, "OMP_NUM_THREADS": "1"}, tmp_path / "logs" / "trainer-0.log")
    child.start()
    assert child.proc.wait(120) != 0
    assert "Root Cause" in child.log_path.read_text(), child.log_path.read_text()  # torchrun's report is there
    return child


def test_a_failed_ranks_tail_ends_with_its_own_traceback_not_torchruns_report(tmp_path):
    child = _failed_torchrun(tmp_path, "text")
    tail = child.tail()
    assert tail.splitlines()[-1] == "RuntimeError: the rank's own last words", tail
    for launcher in ("Root Cause", "error_file", "To enable traceback see", "ChildFailedError", "exitcode"):
        assert launcher not in tail, tail
    assert 'raise RuntimeError("the rank\'s own last words")' in tail  # the traceback's end, not only its last line
    assert child.last_error().endswith("trainer failed: RuntimeError: the rank's own last words")


def test_a_json_logging_ranks_tail_ends_with_its_error_and_the_end_of_its_traceback(tmp_path):
    """JSON logs (spec.monitoring.logFormat's default) hold the traceback in the error line: its last
    lines are printed under it."""
    lines = _failed_torchrun(tmp_path, "json").tail().splitlines()
    assert lines[-1] == "  RuntimeError: the rank's own last words", lines
    stripped = [ln.strip() for ln in lines]
    raised = stripped.index('raise RuntimeError("the rank\'s own last words")')  # the frame that raised
    error = next(i for i, ln in enumerate(lines) if "ERROR grpojob: trainer failed" in ln)
    assert error < raised < len(lines) - 1
    assert not any(w in ln for ln in lines for w in ("Root Cause", "error_file", "ChildFailedError"))
