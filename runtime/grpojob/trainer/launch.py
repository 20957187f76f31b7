"""`grpojob torchrun`: the trainer pod's first process (and `grpojob run`'s trainer child): torchrun
itself, run in this process, starting the `grpojob trainer` ranks, except that SIGTERM goes to the
ranks.

Why not torchrun as it is: its agent turns SIGTERM into a SignalException, kills its ranks and
exits 1 even when they would have exited 0. So a completed trainer stopped by the scale-down to 0
showed `Error` in `kubectl get pods` after its job Succeeded, and a suspended one looked crashed.
Here a rank gets SIGTERM as it would in a pod of its own: it checkpoints and stops (at once when
its training is completed) and exits 0; torchrun sees every rank succeed and exits 0 too. A rank
that fails still fails the launcher, with torchrun's own report. SIGINT, SIGHUP and SIGQUIT stay
torchrun's. Before any rank is started, SIGTERM stops the launcher as it stops torchrun. One that
comes while torch is still being imported is held until the import is done: raised inside it, an
import's own `try/except` could swallow it, and the launcher went on to start the ranks (a
colocated pod whose engine died in its first second kept training for a minute).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Optional

from grpojob import logs
from grpojob.plan import ENV_LOG_FORMAT

log = logging.getLogger("grpojob.trainer.launch")

# torchrun's --nnodes, --nproc-per-node... come from PET_* variables (the plan); the signals its
# agent traps (and turns into a failure) are all of its default but SIGTERM.
TORCHRUN_ARGS = ["--signals-to-handle", "SIGINT,SIGHUP,SIGQUIT", "-m", "grpojob", "trainer"]


def ranks(parent: Optional[int] = None) -> list[int]:
    """The live child processes of `parent` (default: this one): torchrun's ranks, each started
    by the agent itself (in a session of its own, so not reached through our process group)."""
    parent = os.getpid() if parent is None else parent
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdecimal():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == parent:
            out.append(int(entry.name))
    return out


def pass_sigterm(signum, frame) -> None:
    """SIGTERM: to every rank, which stops on its own terms; torchrun then ends with their codes."""
    pids = ranks()
    if not pids:  # nothing started yet (rendezvous): stop as torchrun would
        from torch.distributed.elastic.multiprocessing import SignalException
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
    log.info("SIGTERM: passed to the trainer ranks %s", pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:  # it ended meanwhile
            pass


def main(args: Optional[argparse.Namespace] = None) -> int:
    logs.setup(os.environ.get(ENV_LOG_FORMAT, "text"), tag="[torchrun]", logger="grpojob")
    held: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))
    from torch.distributed.run import main as torchrun

    signal.signal(signal.SIGTERM, pass_sigterm)
    if held:  # it came during the import: act on it now, where nothing swallows it
        pass_sigterm(held[0], None)
    torchrun(TORCHRUN_ARGS)  # raises ChildFailedError (its report, exit 1) when a rank failed
    return 0
