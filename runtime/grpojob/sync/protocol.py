"""The weight-sync rendezvous: keys in the TCPStore that trainer rank 0 hosts.

Everything the two sides tell each other goes through this store; only the weights themselves go
another way: a collective group, a same-host handoff (`handoff`), or files (backend checkpoint).

Keys. The door, open to every client of the store (under `grpojob/`):
- `run`: id of the publisher's incarnation (a restarted trainer has a new one); the nonce of the
  registration proofs and of the private key space.
- `reg/n` (counter) and `reg/<i>`: JSON registration of a rollout server: {"instance", "replica",
  "url", "endpoints": [{"device", "gpu", "host"}] (one per process that receives: vLLM workers),
  "shares_memory", "version", "weights", "proof"}. `instance` is unique per process start;
  `proof` is the HMAC under the job's token of the rest (`credentials`).
- `refused/<instance>`: why the publisher did not take the registration: "unauthorized" (no valid
  proof; nothing more is said), or what an explicit backend cannot reach.
Everything else lives in the incarnation's private space, `grpojob/<space>/` (`credentials`: the
space is derived from the token and `run`; every JSON value there is sealed with the token):
- `probe`: JSON {"path", "token"} of a file under /dev/shm: a server that can read it shares
  memory with the trainer (see `placement`).
- `current`: JSON {"version", "weights"} of the policy the rollout servers should hold. `weights`
  names the bytes: "disk" for the model directory of `spec.model.path` (version 0 before any
  push), "<run>:<version>" for a pushed version.
- `accepted/<instance>`: the publisher took the registration (the server is in its table).
- `hb/<instance>` (counter): heartbeat, bumped every second by each server.
- `cmd/n` (counter) and `cmd/<k>`: the commands, in order. A server reads them from the count it
  saw before registering; it acts on those whose "targets" name it and skips the rest (and any
  that is not sealed with the token). Kinds:
  * push: {"kind": "push", "version", "weights", "layout" (the id of a `layout/<id>`), "adapter",
    "timeout", "targets", "routes":
    {instance: [path per endpoint]}, "groups": {path: {"id", "world", "ranks": {instance: [rank
    or null per endpoint]}}} for the collective paths (nccl, gloo; the publisher is rank 0),
    "handoff": {"shm": segment, "cuda-ipc": {instance: [[handle per bucket] or null per
    endpoint]}}}: every endpoint receives the buckets of `layout` over its route. "adapter": null
    for full weights; with LoRA the PEFT config of the adapter the buckets hold (sync.adapter). The agent
    hands it to its receivers with "keyspace": the space, so they find the keys below.
  * load: {"kind": "load", "version", "weights", "path", "targets"}: load the safetensors in
    `path` (relative to the checkpoint dir; null = the model directory; a LoRA version is a PEFT
    adapter directory).
- `layout/<id>`: JSON of a bucket layout (`buckets.Layout`), published once per layout; push
  commands name it, and the agent hands its receivers the layout itself ("layout", "layout_id").
- `join/<group>/<rank>`: a receiver is about to build the group (so the publisher does not
  wait a whole timeout on a server that died before joining); rank 0's key: everyone joined.
- `pg/<group>/`: the collective group's own rendezvous (c10d's keys).
- `ack/<k>/<instance>`: JSON {"ok", "version", "seconds", "error"} once a command is applied.
- `nack/<k>/<path>`: "<instance>\n<error>" of an endpoint whose collective transfer failed (the
  publisher stops waiting for that group at once).
- `cancel/<k>`: the publisher gave up on command k (a peer died): receivers stop waiting.
- `dropped/<instance>`: the publisher removed this server from the group (reason); the server
  registers again under a new instance id.
"""
from __future__ import annotations

import datetime
import json
import socket
import time
from typing import Any, Optional

from torch.distributed import DistError, TCPStore

PREFIX = "grpojob/"
DISK = "disk"  # weights id of the model directory itself


class WeightSyncError(RuntimeError):
    """A weight push or load failed; the message names the peer and what it was doing."""


def door(*parts: Any) -> str:
    """A key every client of the store may read and write: the registration door."""
    return PREFIX + "/".join(str(p) for p in parts)


def key(space: str, *parts: Any) -> str:
    """A key in a publisher incarnation's private space (`credentials.Credentials.space`)."""
    return f"{PREFIX}{space}/" + "/".join(str(p) for p in parts)


def weights_id(run: str, version: int) -> str:
    return f"{run}:{version}"


def split_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdecimal():
        raise ValueError(f"weight-sync address '{addr}' is not host:port")
    return host.strip("[]"), int(port)


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    """A plain TCP probe: torch's store client logs a stack trace for every refused connect."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def connect(addr: str, timeout: float = 10.0) -> TCPStore:
    """A client of the publisher's store; raises WeightSyncError when it is not reachable."""
    host, port = split_addr(addr)
    if not reachable(host, port, min(timeout, 5.0)):
        raise WeightSyncError(f"the trainer's weight-sync store at {addr} is not reachable")
    try:
        return TCPStore(host, port, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=timeout))
    except DistError as e:
        raise WeightSyncError(f"cannot connect to the trainer's weight-sync store at {addr}: {e}") from e


def get_json(store: TCPStore, k: str) -> Optional[dict]:
    """The JSON under door key k, or None when it is not set (never blocks). Private values go
    through `credentials.Credentials` (sealed)."""
    if not store.check([k]):
        return None
    return json.loads(store.get(k))


def set_json(store: TCPStore, k: str, value: Any) -> None:
    store.set(k, json.dumps(value))


def wait_key(store: TCPStore, k: str, seconds: float, interval: float = 0.01) -> bool:
    """True once k is set; False after `seconds`. Polls with check(): the store's own wait()
    logs a C++ warning on every timeout."""
    end = time.monotonic() + seconds
    while not store.check([k]):
        if time.monotonic() >= end:
            return False
        time.sleep(interval)
    return True


def short_error(e: BaseException) -> str:
    """The first line of a c10d error, without gloo's source path prefix: what a reader needs."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.replace(" GLHF!", "").replace(" 🏖️", "")


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def left(self) -> float:
        return self.seconds - self.elapsed

    @property
    def expired(self) -> bool:
        return self.left <= 0
