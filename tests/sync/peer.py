"""One side of a weight push in its own process, for the tests that kill it mid-broadcast.

    python -m tests.sync.peer receiver STORE_ADDR REPLICA MODE   # MODE: die | hang
    python -m tests.sync.peer publisher PORT_FILE SERVERS        # dies in its second push

Dying/hanging mid-broadcast is made exact by wrapping the transfer functions: a receiver dies in
group.wait_all (its buckets are queued, the bytes in flight); the publisher waits until the
receivers are inside their receive, then dies after queueing half of the buckets."""
from __future__ import annotations

import logging
import os
import signal
import sys
import time

import torch

from grpojob.sync import group

SHAPES = {f"layer{i}.weight": (256, 256) for i in range(16)}


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _die_in_transfer(sig: int) -> None:
    def wait_all(*args, **kwargs):
        print(f"peer {os.getpid()}: signal {sig} mid-transfer", flush=True)
        os.kill(os.getpid(), sig)
        time.sleep(3600)
    group.wait_all = wait_all


def _die_in_send() -> None:
    send, pack = group.send, group.bk.pack

    def dying_send(pg, layout, buffers, tensors, *args):
        time.sleep(1.0)  # the receivers poll for commands every 10 ms: they are receiving now
        packed = [0]

        def dying_pack(*a):
            packed[0] += 1
            if packed[0] > len(layout.buckets) // 2:
                print(f"peer {os.getpid()}: dying after {packed[0] - 1} buckets", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return pack(*a)
        group.bk.pack = dying_pack
        return send(pg, layout, buffers, tensors, *args)
    group.send = dying_send


def receiver(addr: str, replica: str, mode: str) -> None:
    from grpojob.sync.agent import SyncAgent
    from tests.sync.sinks import TensorSink

    _die_in_transfer(signal.SIGKILL if mode == "die" else signal.SIGSTOP)
    SyncAgent(TensorSink(SHAPES), addr, replica=replica, url=f"http://{replica}", model_dir="unused",
              heartbeat_seconds=0.2).start()
    time.sleep(3600)


def publisher(port_file: str, servers: int) -> None:
    from grpojob.sync.publisher import WeightPublisher
    from tests.rollout.harness import make_job

    pub = WeightPublisher(make_job("unused").spec, "127.0.0.1", 0, bucket_mb=0.25)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(pub.port))
    os.replace(port_file + ".tmp", port_file)
    while len(pub.rollout_addresses()) < servers:
        time.sleep(0.05)
    print("pushed", pub.push(weights(1).items(), version=1), flush=True)
    _die_in_send()
    pub.push(weights(2).items(), version=2)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    role, *rest = sys.argv[1:]
    if role == "receiver":
        receiver(rest[0], rest[1], rest[2])
    else:
        publisher(rest[0], int(rest[1]))
