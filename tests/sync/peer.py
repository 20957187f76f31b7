"""One side of a weight push in its own process: for pushes between two real processes, and for
the tests that kill a peer mid-broadcast.

    python -m tests.sync.peer serve STORE_ADDR REPLICA DEVICE OUT   # reports each load to OUT
    python -m tests.sync.peer receiver STORE_ADDR REPLICA MODE      # MODE: die | hang
    python -m tests.sync.peer publisher PORT_FILE SERVERS           # dies in its second push
    python -m tests.sync.peer rogue STORE_ADDR REPLICA MODE OUT     # MODE: wrong-token | no-token

Every peer holds the job's token TOKEN, except a rogue: with another token it runs a real
SyncAgent; without one it writes a registration by hand (what a client that does not know the
protocol's proof sends). Like `serve`, it reports to OUT every tensor that would reach it.

`serve` writes {"version", "digest"} (see `digest`) to OUT after every load, so the test checks
the bytes that arrived in the other process. Dying/hanging mid-broadcast is made exact by
wrapping the transfer: a receiver dies in Transfer.wait (its buckets are queued, the bytes in
flight); the publisher waits until the receivers are inside their receive, then dies after
packing half of the buckets."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from grpojob.sync import group

REPO = Path(__file__).resolve().parents[2]
TOKEN = "the-jobs-token-for-these-tests"
SHAPES = {f"layer{i}.weight": (256, 256) for i in range(16)}


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def digest(named: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(named):
        h.update(n.encode())
        h.update(named[n].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def spawn(*args: str, log_path) -> subprocess.Popen:
    """This module as a process of its own (its own session: `reap` ends it and its children)."""
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "tests.sync.peer", *args], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    proc.log_path = log_path
    return proc


def reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)  # a stopped peer must wake up to die
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _die_in_transfer(sig: int) -> None:
    def wait(self, *args, **kwargs):
        print(f"peer {os.getpid()}: signal {sig} mid-transfer", flush=True)
        os.kill(os.getpid(), sig)
        time.sleep(3600)
    group.Transfer.wait = wait


def _die_in_send() -> None:
    init, pack = group.Transfer.__init__, group.bk.pack

    def dying_init(self, pg, layout, buffers, *, ready=None):
        time.sleep(1.0)  # the receivers poll for commands every 5 ms: they are receiving now
        packed = [0]

        def dying_pack(*a):
            packed[0] += 1
            if packed[0] > len(layout.buckets) // 2:
                print(f"peer {os.getpid()}: dying after {packed[0] - 1} buckets", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return pack(*a)
        group.bk.pack = dying_pack
        init(self, pg, layout, buffers, ready=ready)
    group.Transfer.__init__ = dying_init


def _reporting_sink(out: str, device: str = "cpu"):
    from tests.sync.sinks import TensorSink

    class Reporting(TensorSink):
        def _load(self, named, version, weights):
            super()._load(named, version, weights)
            with open(out + ".tmp", "w") as f:
                json.dump({"version": version, "digest": digest(self.tensors)}, f)
            os.replace(out + ".tmp", out)
    return Reporting(SHAPES, device)


def serve(addr: str, replica: str, device: str, out: str) -> None:
    from grpojob.sync.agent import SyncAgent

    SyncAgent(_reporting_sink(out, device), addr, token=TOKEN, replica=replica, url=f"http://{replica}",
              model_dir="unused", heartbeat_seconds=0.2).start()
    time.sleep(3600)


def rogue(addr: str, replica: str, mode: str, out: str) -> None:
    """A process that is not the job's: it tries to register and reports what reaches it."""
    from grpojob.sync import placement, protocol
    from grpojob.sync.agent import SyncAgent

    url = f"http://{replica}.attacker.example:8000"
    if mode == "wrong-token":
        agent = SyncAgent(_reporting_sink(out), addr, token="not-" + TOKEN, replica=replica, url=url,
                          model_dir="unused", heartbeat_seconds=0.2).start()
        while not agent.refused:
            time.sleep(0.05)
        print(f"rogue {replica}: refused: {agent.refused}", flush=True)
    else:  # no token: a registration without a proof, then listen for anything addressed to it
        store = protocol.connect(addr)
        instance = f"{replica}-0"
        i = store.add(protocol.door("reg", "n"), 1)
        protocol.set_json(store, protocol.door("reg", i), {
            "instance": instance, "replica": replica, "url": url, "endpoints": [placement.local("cpu").to_json()],
            "shares_memory": False, "version": 0, "weights": protocol.DISK})
        refused = protocol.door("refused", instance)
        while not store.check([refused]):
            time.sleep(0.05)
        print(f"rogue {replica}: refused: {store.get(refused).decode()}", flush=True)
    time.sleep(3600)


def receiver(addr: str, replica: str, mode: str) -> None:
    from grpojob.sync.agent import SyncAgent
    from tests.sync.sinks import TensorSink

    _die_in_transfer(signal.SIGKILL if mode == "die" else signal.SIGSTOP)
    SyncAgent(TensorSink(SHAPES), addr, token=TOKEN, replica=replica, url=f"http://{replica}", model_dir="unused",
              heartbeat_seconds=0.2).start()
    time.sleep(3600)


def publisher(port_file: str, servers: int) -> None:
    from grpojob.api.spec import WeightSyncSpec
    from grpojob.sync.publisher import WeightPublisher

    # delta off: a dense push streams its buckets as they are packed, so the trainer dies with
    # buckets on the wire (a delta push is whole before it is sent: test_delta)
    pub = WeightPublisher(WeightSyncSpec(timeout_seconds=20, bucket_size_mb=1, delta=False), host="127.0.0.1",
                          port=0, token=TOKEN)
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
    if role == "serve":
        serve(*rest)
    elif role == "receiver":
        receiver(rest[0], rest[1], rest[2])
    elif role == "rogue":
        rogue(*rest)
    else:
        publisher(rest[0], int(rest[1]))
