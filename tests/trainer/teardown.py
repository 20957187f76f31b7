"""Two-rank gloo groups that end the way a trainer rank ends (grpojob.learner.dist.shutdown, then
lifeline.exit_now), many times in a row, for tests/trainer/test_teardown.py.

`python teardown.py leave RUNS`: RUNS pairs of ranks, one pair after the other, each forked from
this process (torch is imported once: a run takes a fraction of a second). Each rank joins the
default group as a torchrun rank does (RANK, WORLD_SIZE, MASTER_*), makes a second gloo group (the
checkpoint manager's), runs collectives on both, rank 1 lagging behind, and leaves. Prints one
line per run: the two exit codes (a signal as its negative number: -6 is the abort).

`python teardown.py absent SECONDS`: rank 1 never leaves (it hangs); rank 0 leaves with a timeout
of SECONDS and prints whether it left cleanly and how long it waited.
"""
from __future__ import annotations

import os
import random
import sys
import time

import torch
import torch.distributed as tdist

from grpojob import lifeline
from grpojob.learner import dist


def join(rank: int, port: int) -> dist.DistEnv:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), GRPOJOB_DEVICE="cpu")
    return dist.init(timeout_seconds=60)


def rank_leaves(rank: int, port: int) -> None:
    env = join(rank, port)
    second = tdist.new_group(backend="gloo")
    t = torch.ones(4096)
    for _ in range(10):
        dist.all_sum(t, env)
        tdist.all_reduce(t, group=second)
    pending = tdist.all_reduce(t, group=second, async_op=True)  # as DCP's writer thread does
    if rank == 1:  # the peer that is still working when rank 0 leaves
        sum(i * i for i in range(300_000))
    pending.wait()
    clean = dist.shutdown(env, clean=True)
    lifeline.exit_now(0 if clean else 3)


def fork(target, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            target(*args)
        finally:
            os._exit(4)  # target raised
    return pid


def leave(runs: int) -> None:
    for run in range(runs):
        port = random.randrange(20000, 30000)
        pids = [fork(rank_leaves, rank, port) for rank in (0, 1)]
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        print(f"run {run}: {codes[0]} {codes[1]}", flush=True)


def absent(seconds: float) -> None:
    port = random.randrange(20000, 30000)
    hung = fork(lambda: (join(1, port), time.sleep(600)))
    env = join(0, port)
    started = time.monotonic()
    clean = dist.shutdown(env, clean=True, timeout=seconds)
    print(f"clean {clean} waited {time.monotonic() - started:.1f}", flush=True)
    os.kill(hung, 9)
    lifeline.exit_now(0)


if __name__ == "__main__":
    {"leave": lambda n: leave(int(n)), "absent": lambda s: absent(float(s))}[sys.argv[1]](sys.argv[2])
