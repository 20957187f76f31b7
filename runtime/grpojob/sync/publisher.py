"""WeightPublisher: trainer rank 0's side of weight sync.

    pub = WeightPublisher(spec.weight_sync, host="0.0.0.0", port=SYNC_STORE_PORT, device=env.device,
                          token=auth.token)
    pub.rollout_addresses()        # http URLs of the servers that hold the current version
    stats = pub.push(model.state_dict().items(), version=step)   # or a TensorStream
    pub.backend_in_use()           # "cuda-ipc", "gloo,nccl", ...: /status weightSyncBackend
    pub.close()

- It hosts the rendezvous store (`TCPStore(is_master=True)`); rollout servers register there
  (`membership`) with a proof of the job's token (`credentials`: a registration without one is
  refused, and every other key lives in a space derived from the token, its values sealed with
  it): this is how the trainer discovers rollouts, locally and on a cluster. Each
  server's endpoints get a route from their placement against the trainer's device
  (`placement`): NCCL between GPUs, CUDA IPC on the trainer's own GPU, gloo with a CPU on either
  side, or what weightSync.backend forces (refused, naming the server, where it cannot work).
- `push` takes the full HF-named state dict (tensors on any device; tied duplicates are sent
  once), as a `stream.TensorStream` whose tensors are produced one by one while the buckets fill
  (a trainer gathers each from its shards then; a LoRA trainer's holds only the adapter, whose
  PEFT config travels in the command as "adapter") or as named tensors in memory, and brings every
  registered server to it over its route (`delivery`), then returns stats: version, seconds,
  bytes, buckets, servers (that acknowledged), dropped (replicas removed because they died or
  failed), tensors, adapter (a LoRA push), paths ({path: [replica]}), backend (the paths, in
  words), delta (with weightSync.delta: values, changed_values, sent_bytes and dense_bytes per
  receiver, delta_buckets; `delta`) and gathered_peak_bytes /
  gathered_peak_tensors (the most of a stream's produced tensors alive at once). A
  server that dies mid-push is named in the log and dropped; the push is retried on the
  survivors, so the trainer's step goes on. With no server registered, `push` keeps the weights.
- A server that registers later (new, restarted, or re-joining after the trainer restarted) is
  brought to the last pushed version in the background while the trainer keeps training, and
  only then counts as ready.
- Version 0 is the model directory itself: servers load it from `spec.model.path` at start, so
  before the first push they already hold the current policy. A trainer that resumes from a
  checkpoint passes `initial_version=None` (nothing is current until its first push) and
  pushes before it asks for generations.
- Every wait has a timeout (`weightSync.timeoutSeconds`); a server that stops heartbeating for
  `heartbeat_timeout` seconds is declared dead at once, without waiting for the full timeout.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
from typing import Iterable, Optional

import torch
from torch.distributed import DistError, TCPStore

from grpojob import devices
from grpojob.api.spec import SYNC_STORE_PORT, WeightSyncSpec
from grpojob.sync import placement
from grpojob.sync.delivery import Delivery, Outcome
from grpojob.sync.credentials import Credentials
from grpojob.sync.membership import Membership
from grpojob.sync.protocol import DISK, WeightSyncError, door, weights_id
from grpojob.sync.stream import TensorStream

log = logging.getLogger("grpojob.sync")


class WeightPublisher:
    def __init__(self, sync: WeightSyncSpec, *, token: str, host: str = "0.0.0.0", port: int = SYNC_STORE_PORT,
                 device: Optional[torch.device | str] = None, initial_version: Optional[int] = 0,
                 checkpoint_dir: Optional[str] = None, heartbeat_timeout: float = 10.0, colocated: bool = False):
        """`token`: the job's token (grpojob.auth), which the rollout servers prove they hold;
        `colocated`: spec.placement colocated (routes by `placement.colocated_route`: no network copy);
        `device`: where the trainer's weights live (default: `grpojob.devices.default()`);
        `checkpoint_dir`: the directory shared with the rollout servers (backend checkpoint)."""
        if device is None:
            device = devices.default()
        self.sync = sync
        self.colocated = colocated
        self.device = torch.device(device)
        self.endpoint = placement.local(self.device)
        placement.check_trainer(sync.backend, self.endpoint)
        if sync.backend == "checkpoint" and not checkpoint_dir:
            raise ValueError(f"{placement.BACKEND_FIELD}: checkpoint needs a checkpoint directory "
                             f"that the rollout servers mount too")
        try:
            self.store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=sync.timeout_seconds))
        except DistError as e:
            raise WeightSyncError(f"cannot host the weight-sync store on {host}:{port}: {e}") from e
        self.port = self.store.port
        self.run = uuid.uuid4().hex[:16]  # also the nonce of registration proofs
        self.creds = Credentials(token, self.run)
        self.store.set(door("run"), self.run)
        self._probe = placement.write_probe(self.run)
        self.creds.set_json(self.store, self.creds.key("probe"), self._probe)
        self._current: Optional[dict] = None
        if initial_version is not None:
            self._set_current(initial_version, DISK)
        self._lock = threading.Lock()  # one push or catch-up at a time
        local_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        self.members = Membership(self.store, f"{local_host}:{self.port}", self.creds,
                                  heartbeat_timeout=heartbeat_timeout, route=self._route, after_round=self._catch_up)
        self.delivery = Delivery(self.store, self.creds, self.device, sync, self.members, checkpoint_dir)
        self.members.start()
        log.info("weight-sync store listening on port %d (backend %s, trainer on %s, buckets of %d MiB)",
                 self.port, sync.backend, self.endpoint, sync.bucket_size_mb)

    # ---- public API -------------------------------------------------------------------------
    def rollout_addresses(self) -> list[str]:
        """HTTP base URLs of the registered servers that hold the current version."""
        cur = self._current
        return [m.url for m in self.members.live() if cur and m.weights == cur["weights"]]

    def draining_addresses(self) -> list[str]:
        """HTTP base URLs of servers that left the group on their own moments ago (stopping: scaled
        down): they finish the requests they have, which the rollout client waits for."""
        return self.members.draining()

    def servers(self) -> list[dict]:
        """Every registered server: replica, url, version, in_sync, routes (one per endpoint)."""
        cur = self._current
        return [{"replica": m.replica, "url": m.url, "version": m.version, "routes": list(m.routes),
                 "in_sync": bool(cur and m.weights == cur["weights"])} for m in self.members.all()]

    def refused(self) -> dict[str, str]:
        """Replica -> why its registration was refused (an explicit backend that cannot reach it)."""
        return dict(self.members.refused)

    def backend_in_use(self) -> Optional[str]:
        """The paths to the registered servers, e.g. "cuda-ipc" or "gloo,nccl" (None: no server)."""
        paths = sorted({p for m in self.members.live() for p in m.routes})
        return ",".join(paths) or None

    def push(self, weights: TensorStream | Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send a full state dict as `version` to every registered server; see the module doc.
        `weights`: a TensorStream (produced tensor by tensor, e.g. gathered from shards: it is
        exhausted when push returns; after an error the caller drains it, so that the trainer's
        other ranks finish their gathers) or named tensors already in memory."""
        start = time.perf_counter()
        stream = weights if isinstance(weights, TensorStream) else TensorStream.of(weights)
        wid = weights_id(self.run, version)
        with self._lock:
            retained = self.delivery.retain(stream, version, wid)
            targets = self.members.live()
            if targets:
                out = self.delivery.push(targets, stream, main=True)
            else:
                self.delivery.keep(stream)
                out = Outcome([], [])
            self._set_current(version, wid)
        paths = out.paths
        stats = {"version": version, "seconds": time.perf_counter() - start, "bytes": retained.layout.nbytes,
                 "tensors": len(retained.layout.names), "adapter": stream.adapter is not None,
                 "buckets": len(retained.layout.buckets), "servers": len(out.ok),
                 "dropped": [m.replica for m in out.dropped], "paths": paths, "paused_seconds": out.paused_seconds,
                 "backend": placement.describe(paths) if paths else None,
                 "gathered_peak_bytes": stream.peak_bytes, "gathered_peak_tensors": stream.peak_tensors,
                 "delta": self.delivery.last_delta if targets else None}
        if targets:
            log.info("pushed %s version %d to %d server(s) via %s in %.3f s (%.3f MiB)%s",
                     "the LoRA adapter of" if stream.adapter is not None else "weights", version,
                     len(out.ok), stats["backend"] or "no path", stats["seconds"], stats["bytes"] / 2**20,
                     f"; dropped {', '.join(stats['dropped'])}" if out.dropped else "")
        else:
            log.info("kept weights version %d for the rollout servers to come (none registered)", version)
        return stats

    def close(self) -> None:
        self.members.close()
        with self._lock:
            self.delivery.close()
        placement.remove_probe(self._probe)
        try:
            self.store.set(self.creds.key("closed"), "1")
        except DistError:
            pass
        del self.store

    def __enter__(self) -> "WeightPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------------
    def _route(self, endpoint: placement.Endpoint, shares_memory: bool) -> str:
        choose = placement.colocated_route if self.colocated else placement.route
        return choose(self.sync.backend, self.endpoint, endpoint, shares_memory)

    def _set_current(self, version: int, wid: str) -> None:
        self._current = {"version": version, "weights": wid}
        self.creds.set_json(self.store, self.creds.key("current"), self._current)

    def _catch_up(self) -> None:
        """Bring servers that registered with other weights to the current version. Called on the
        membership watcher's thread, it hands the push to a thread of its own: the watcher must keep
        scanning heartbeats meanwhile, or a late server that froze mid-push is never declared dead
        and the push waits out its whole deadline."""
        cur = self._current
        if not cur or all(m.weights == cur["weights"] for m in self.members.live()):
            return
        if not self._lock.acquire(blocking=False):  # a push or a catch-up is running: the next round
            return
        try:
            threading.Thread(target=self._catch_up_locked, name="grpojob-sync-catch-up", daemon=True).start()
        except BaseException:
            self._lock.release()
            raise

    def _catch_up_locked(self) -> None:
        try:
            cur = self._current
            late = [m for m in self.members.live() if m.weights != cur["weights"]]
            if not late:
                return
            log.info("bringing %s to version %d", ", ".join(str(m) for m in late), cur["version"])
            if cur["weights"] == DISK:  # version 0: the servers reload the model directory
                self.delivery.load(late, cur["version"], DISK, None)
            else:
                out = self.delivery.push(late, None, main=False)
                if out.ok:
                    log.info("brought %d server(s) to version %d via %s", len(out.ok), cur["version"],
                             placement.describe(out.paths))
        except Exception:  # noqa: BLE001 -- the next round retries; the trainer's own pushes go on
            log.exception("bringing late servers to the current version failed")
        finally:
            self._lock.release()
