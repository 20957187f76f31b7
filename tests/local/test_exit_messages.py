"""What `grpojob run` says when a child exits (issue 42): a trainer whose rank was killed outright
(kill -9 leaves no error of its own) is named with torchrun's word on the rank, and its restart
says which checkpoint it resumes from. A real torchrun runs a rank that kills itself."""
from __future__ import annotations

import os
import sys

from grpojob.checkpoint import layout
from grpojob.local.processes import Child
from grpojob.local.restarts import resumes_from, what_happened

RANK = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def test_a_rank_killed_outright_is_named_with_its_signal_from_this_start_only(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    log = tmp_path / "logs" / "trainer-0.log"
    log.parent.mkdir()
    log.write_text("E1128 06:59:47.691000 1 api.py:1002] failed (exitcode: -11) local_rank: 1 (pid: 1) of binary\n")
    child = Child("trainer-0", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                                "--master-port", "0", str(script)], {**os.environ, "OMP_NUM_THREADS": "1"}, log)
    child.start()
    assert child.proc.wait(120) == 1
    assert what_happened(child) == "trainer-0 exited with code 1 (local rank 0 killed by signal 9 (Killed))", \
        log.read_text()[-3000:]


PEERS = """
import os, signal, sys, time
from pathlib import Path
from torch.distributed.elastic.multiprocessing.errors import record

mark = Path(sys.argv[1])


def dead(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


@record
def main():
    if os.environ["LOCAL_RANK"] == "1":
        mark.with_suffix(".tmp").write_text(str(os.getpid()))
        mark.with_suffix(".tmp").rename(mark)
        os.kill(os.getpid(), signal.SIGKILL)
    while not mark.exists() or not dead(int(mark.read_text())):
        time.sleep(0.005)
    raise ConnectionResetError("Connection reset by peer")  # what gloo says on a killed peer


main()
"""


def test_a_rank_killed_outright_is_named_even_when_torchrun_times_its_peers_error_first(tmp_path):
    """Rank 1 is killed, then rank 0 fails on the broken connection and writes its error file.
    torchrun, polling once both are gone, times rank 0's failure first (its error file's mtime) and
    names only rank 0 in its one-line report; its summary table lists both, and the kill is what
    happened (CI, stop 49: the runner said only rank 0's "Connection reset by peer")."""
    script = tmp_path / "rank.py"
    script.write_text(PEERS)
    log = tmp_path / "trainer-0.log"
    child = Child("trainer-0", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                "--master-port", "0", "--monitor-interval", "3", str(script), str(tmp_path / "mark")],
                  {**os.environ, "OMP_NUM_THREADS": "1"}, log)
    child.start()
    assert child.proc.wait(120) == 1
    said = what_happened(child)
    assert said.startswith("trainer-0 exited with code 1 (local rank 1 killed by signal 9 (Killed))"), \
        (said, log.read_text()[-3000:])


def test_a_restarted_trainer_is_said_to_resume_from_the_newest_complete_checkpoint(tmp_path):
    assert resumes_from(tmp_path / "none") == "; it starts over (no checkpoint yet)"
    for step in (3, 6):
        d = layout.step_dir(tmp_path, step)
        (d / layout.SHARDS).mkdir(parents=True)
        (d / layout.SHARDS / ".metadata").write_bytes(b"")
        (d / layout.STATE_FILE).write_bytes(b"")
    layout.temp_dir(tmp_path, 9).mkdir()  # a save that never committed
    said = resumes_from(tmp_path)
    assert layout.latest(tmp_path) is not None, "the test's checkpoints must count as complete"
    assert said == "; it resumes from step-000006 (the steps after 6 are trained again)", said
