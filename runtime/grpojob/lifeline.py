"""A process ends with the process that started it, and ends at all once it has decided to.

- `python -m grpojob.lifeline PARENT_PID -- CMD ARGS...`: on Linux, ask the kernel for SIGTERM when
  the parent dies (prctl PR_SET_PDEATHSIG, kept across exec), then exec CMD. `grpojob run` starts
  every child through it, so a runner killed even with SIGKILL takes torchrun, the rollout servers
  and the environments down with it, each with a chance to stop cleanly (SIGTERM: the trainer
  checkpoints, torchrun passes it to its ranks). The kernel sends it when the *thread* that forked
  the child exits: the runner forks from its main thread only. Elsewhere (macOS) it only execs.
- `watch_parent(on_lost, grace)`: a daemon thread notices that the parent is gone (the process was
  re-parented), runs `on_lost` (the process's SIGTERM path) and ends the process `grace` seconds
  later whatever it is doing. Trainer ranks (torchrun's children, in sessions of their own) and
  rollout servers arm it; it needs no prctl, so it works on macOS too.
- `exit_within(seconds, code)`: a process that has decided to exit arms a daemon timer that ends
  it with `code` if its clean shutdown has not finished by then (a blocked executor thread, a
  join, an HTTP connection that does not close): saying "exiting" means exiting.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable

log = logging.getLogger("grpojob")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_PARENT_GONE = 128 + signal.SIGTERM  # as if SIGTERM had ended it


def arm_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Linux: `sig` when the parent (thread) dies. False where the kernel offers no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


def watch_parent(on_lost: Callable[[], None], grace: float, interval: float = 0.5) -> None:
    parent = os.getppid()
    if parent <= 1:  # PID 1's child in a container (or already orphaned): nothing to outlive
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        log.warning("parent process %d is gone: stopping (at most %.0f s)", parent, grace)
        exit_within(grace, EXIT_PARENT_GONE)
        on_lost()

    threading.Thread(target=watch, name="grpojob-parent-watch", daemon=True).start()


def exit_within(seconds: float, code: int) -> None:
    def hard_exit() -> None:
        log.error("still running %.0f s after it began to exit: ending the process now (code %d)", seconds, code)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - exiting regardless
                pass
        os._exit(code)

    timer = threading.Timer(seconds, hard_exit)
    timer.name, timer.daemon = "grpojob-exit-deadline", True
    timer.start()


def exit_now(code: int) -> None:
    """End this process at once with `code`, once what Python buffered (logs, stdout) is out.
    Why not a normal exit: the interpreter's finalisation runs the C++ destructors of
    torch.distributed's objects (gloo's threads) in no safe order, which aborts a rank that
    finished cleanly ("terminate called without an active exception", exit -6; seen on 2-rank gloo
    runs, where torchrun then reports the job failed). Call it only once the work is closed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing more can be written
            pass
    os._exit(code)


def main(argv: list[str]) -> None:
    """PARENT_PID -- CMD ARGS...: arm the parent-death signal, then become CMD."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdecimal():
        sys.exit("usage: python -m grpojob.lifeline PARENT_PID -- CMD [ARGS...]")
    if arm_parent_death_signal() and os.getppid() != int(argv[0]):
        os._exit(EXIT_PARENT_GONE)  # the parent died before the signal was armed
    os.execvp(argv[2], argv[2:])  # a command name too (benchmarks put taskset in front)


if __name__ == "__main__":
    main(sys.argv[1:])
