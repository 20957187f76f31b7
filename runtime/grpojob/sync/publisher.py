"""WeightPublisher: trainer rank 0's side of weight sync.

    pub = WeightPublisher(spec, port=SYNC_STORE_PORT)   # hosts the TCPStore (or .from_env(spec))
    pub.rollout_addresses()                           # http URLs of the servers holding the policy
    stats = pub.push(model.state_dict().items(), version=step)   # publish(): the same
    pub.close()

- It hosts the rendezvous store (`TCPStore(is_master=True)`); rollout servers register there
  (see `protocol`). `rollout_addresses()` lists the registered servers that hold the current
  version: this is how the trainer discovers rollouts, locally and on a cluster.
- `push` takes the full HF-named state dict (tensors on any device; tied duplicates are sent
  once), packs it into flat dtype-grouped buckets of `weightSync.bucketSizeMb` and broadcasts them
  over a standalone group (gloo on CPU, NCCL on GPU) to every registered server, then waits until
  each server acknowledged that it loaded the version. Returns stats: version, seconds, bytes,
  buckets, servers (that acknowledged), dropped (replica names removed because they died or
  failed). A server that dies mid-push is named in the log and dropped; the push is retried on
  the survivors, so the trainer's step goes on. With no server registered, `push` only keeps the
  weights and returns.
- The publisher keeps the last pushed version (the packed buckets; for backend checkpoint, the
  files). A server that registers later (new, restarted, or re-joining after the trainer
  restarted) is brought to that version in the background while the trainer keeps training, and
  only then counts as ready. Cost: one extra copy of the weights on trainer rank 0 (host memory
  for gloo, GPU memory for NCCL).
- Version 0 is the model directory itself: servers load it from `spec.model.path` at start, so
  before the first push they already hold the current policy. A trainer that resumes from a
  checkpoint constructs the publisher with `initial_version=None` (nothing is current until its
  first push) and pushes before it asks for generations.
- Every wait has a timeout (`weightSync.timeoutSeconds`); a server that stops heartbeating for
  `heartbeat_timeout` seconds is declared dead at once, without waiting for the full timeout.
"""
from __future__ import annotations

import datetime
import itertools
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch
from torch.distributed import DistError, TCPStore

from ..api.spec import SYNC_STORE_PORT, GRPOJobSpec
from ..plan import ENV_CHECKPOINT_DIR, ENV_SYNC_ADDR
from . import buckets as bk
from . import files
from . import group as grp
from .protocol import (DISK, Deadline, WeightSyncError, connect, get_json, key, set_json, split_addr,
                       weights_id)

log = logging.getLogger("grpojob.sync")

WATCH_SECONDS = 0.25
ACK_POLL_SECONDS = 0.002  # only while a push waits for its acknowledgements
MAX_ATTEMPTS = 3


@dataclass
class Member:
    instance: str
    replica: str
    url: str
    workers: int
    weights: str  # weights id it holds
    version: int
    index: int  # registration order
    hb: int = -1
    hb_at: float = field(default_factory=time.monotonic)
    dead: Optional[str] = None  # why it was removed

    def __str__(self) -> str:
        return f"rollout server '{self.replica}' ({self.url})"


@dataclass
class _Retained:
    layout: bk.Layout
    buffers: list
    version: int = -1
    weights: str = ""
    path: Optional[str] = None  # backend checkpoint: relative path of the saved version


class WeightPublisher:
    def __init__(self, spec: GRPOJobSpec, host: str = "0.0.0.0", port: int = SYNC_STORE_PORT, *,
                 backend: Optional[str] = None, timeout: Optional[float] = None,
                 bucket_mb: Optional[float] = None, initial_version: Optional[int] = 0,
                 checkpoint_dir: Optional[str] = None, heartbeat_timeout: float = 10.0,
                 device: Optional[str] = None):
        ws = spec.weight_sync
        self.spec = spec
        self.timeout = float(timeout if timeout is not None else ws.timeout_seconds)
        self.bucket_bytes = int((bucket_mb if bucket_mb is not None else ws.bucket_size_mb) * 2**20)
        self.heartbeat_timeout = heartbeat_timeout
        backend = backend or ws.backend
        if device is None:
            from .. import devices

            device = devices.default() if backend in ("auto", "nccl") else "cpu"
        self.device = torch.device(device)
        self.backend = backend if backend == "checkpoint" else grp.resolve_backend(backend, self.device)
        self.checkpoint_dir = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR)
        if self.backend == "checkpoint" and not self.checkpoint_dir:
            raise ValueError(f"weightSync.backend checkpoint needs a checkpoint directory "
                             f"({ENV_CHECKPOINT_DIR} or checkpoint_dir=)")
        try:
            self.store = TCPStore(host, port, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=self.timeout))
        except DistError as e:
            raise WeightSyncError(f"cannot host the weight-sync store on {host}:{port}: {e}") from e
        self.port = self.store.port
        self._local_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        self.run = uuid.uuid4().hex[:8]
        self.store.set(key("run"), self.run)
        self._current: Optional[dict] = None
        if initial_version is not None:
            self._set_current(initial_version, DISK)
        self._members: dict[str, Member] = {}
        self._mlock = threading.Lock()  # member table
        self._lock = threading.Lock()  # one push or catch-up at a time
        self._retained: Optional[_Retained] = None
        self._main: Optional[tuple[str, tuple[str, ...], object]] = None  # (group id, members, pg)
        self._groups = itertools.count(1)
        self._closed = threading.Event()
        self._seen_regs = 0
        self._watcher = threading.Thread(target=self._watch, name="grpojob-sync-watch", daemon=True)
        self._watcher.start()
        log.info("weight-sync store listening on port %d (backend %s, buckets of %.0f MiB)",
                 self.port, self.backend, self.bucket_bytes / 2**20)

    # ---- public API -------------------------------------------------------------------------
    @property
    def version(self) -> Optional[int]:
        return self._current["version"] if self._current else None

    def rollout_addresses(self) -> list[str]:
        """HTTP base URLs of the registered servers that hold the current version."""
        cur = self._current
        with self._mlock:
            members = sorted(self._members.values(), key=lambda m: m.index)
        return [m.url for m in members if cur and m.weights == cur["weights"] and not m.dead]

    def servers(self) -> list[dict]:
        """Every registered server: replica, url, version, in_sync."""
        cur = self._current
        with self._mlock:
            members = sorted(self._members.values(), key=lambda m: m.index)
        return [{"replica": m.replica, "url": m.url, "version": m.version,
                 "in_sync": bool(cur and m.weights == cur["weights"])} for m in members]

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send a full state dict as `version` to every registered server; see the module doc."""
        start = time.perf_counter()
        named = bk.dedup_tied(named_tensors)
        wid = weights_id(self.run, version)
        with self._lock:
            retained = self._retain(named)
            tensors = dict(named)
            if self.backend == "checkpoint":
                retained.path = files.save(self.checkpoint_dir, version, named)
                tensors = None
            retained.version, retained.weights = version, wid
            targets = self._live()
            if not targets:
                if tensors is not None:  # keep the bytes for servers that register later
                    with bk.host_copies(retained.buffers):
                        for b, buf in zip(retained.layout.buckets, retained.buffers):
                            bk.pack(b, tensors, buf)
                self._set_current(version, wid)
                return self._stats(version, start, retained, [], [])
            ok, dropped = self._deliver(targets, retained, tensors, main=True,
                                        load=self.backend == "checkpoint")
            self._set_current(version, wid)
        stats = self._stats(version, start, retained, ok, dropped)
        log.info("pushed weights version %d to %d server(s) in %.3f s (%.1f MiB)%s", version,
                 len(ok), stats["seconds"], stats["bytes"] / 2**20,
                 f"; dropped {', '.join(stats['dropped'])}" if dropped else "")
        return stats

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """The trainer loop's WeightPublisher hook (grpojob.trainer.sources): same as push."""
        return self.push(named_tensors, version)

    @classmethod
    def from_env(cls, spec: GRPOJobSpec, **kw) -> "WeightPublisher":
        """Listen on the port of GRPOJOB_SYNC_ADDR (the plan's address of this store)."""
        addr = os.environ.get(ENV_SYNC_ADDR)
        port = split_addr(addr)[1] if addr else SYNC_STORE_PORT
        return cls(spec, "0.0.0.0", port, **kw)

    def close(self) -> None:
        self._closed.set()
        self._watcher.join(timeout=5)
        self._main = None
        try:
            self.store.set(key("closed"), "1")
        except DistError:
            pass
        del self.store

    def __enter__(self) -> "WeightPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- delivery -----------------------------------------------------------------------------
    def _retain(self, named: list[tuple[str, torch.Tensor]]) -> _Retained:
        """The buffers of this push: the previous ones when the layout did not change."""
        layout = bk.plan([(n, tuple(t.shape), t.dtype) for n, t in named], self.bucket_bytes)
        old = self._retained
        if old is None or old.layout != layout or self.backend == "checkpoint":
            bufs = [] if self.backend == "checkpoint" else [bk.allocate(b, self.device) for b in layout.buckets]
            self._retained = _Retained(layout, bufs)
        return self._retained

    def _deliver(self, targets: list[Member], retained: _Retained, tensors: Optional[dict], *,
                 main: bool, load: bool) -> tuple[list[Member], list[Member]]:
        """Bring `targets` to the retained version (a broadcast, or with `load` a load command);
        retries on the survivors when a peer dies. Returns (acknowledged, dropped)."""
        dropped: list[Member] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            seq = self.store.add(key("cmd", "n"), 1)
            try:
                if load:
                    acks = self._load_cmd(seq, targets, retained.version, retained.weights, retained.path)
                else:
                    acks = self._push_cmd(seq, targets, retained, tensors, main)
                    tensors = None  # packed now
            except WeightSyncError as e:
                self.store.set(key("cancel", seq), str(e))
                self._main = None
                if tensors is not None:  # finish packing so a retry can send the buffers
                    with bk.host_copies(retained.buffers):
                        for b, buf in zip(retained.layout.buckets, retained.buffers):
                            bk.pack(b, tensors, buf)
                    tensors = None
                alive, lost = self._triage(seq, targets, e)
                for m, why in lost:
                    log.error("weight push of version %d: %s %s; removing it from the group",
                              retained.version, m, why)
                    self._drop(m, why)
                    dropped.append(m)
                targets = alive
                if not targets:
                    return [], dropped
                if attempt < MAX_ATTEMPTS:
                    log.warning("retrying version %d on %d server(s)", retained.version, len(targets))
                continue
            ok = []
            for m in targets:
                a = acks[m.instance]
                if a.get("ok"):
                    m.weights, m.version = retained.weights, retained.version
                    ok.append(m)
                else:
                    log.error("%s failed to load version %d: %s", m, retained.version, a.get("error"))
                    self._drop(m, f"failed to load version {retained.version}: {a.get('error')}")
                    dropped.append(m)
            return ok, dropped
        for m in targets:
            self._drop(m, f"could not be brought to version {retained.version} in {MAX_ATTEMPTS} attempts")
            dropped.append(m)
        return [], dropped

    def _push_cmd(self, seq: int, targets: list[Member], retained: _Retained,
                  tensors: Optional[dict], main: bool) -> dict[str, dict]:
        names = tuple(m.instance for m in targets)
        reuse = main and self._main is not None and self._main[1] == names
        gid = self._main[0] if reuse else f"{self.run}-{next(self._groups)}"
        ranks, world = {}, 1
        for m in targets:
            ranks[m.instance] = world
            world += m.workers
        cmd = {"seq": seq, "kind": "push", "version": retained.version, "weights": retained.weights,
               "group": gid, "backend": self.backend, "world": world, "ranks": ranks,
               "layout": retained.layout.to_json(), "timeout": self.timeout}
        set_json(self.store, key("cmd", seq), cmd)
        deadline = Deadline(self.timeout)
        poll = self._liveness(targets)
        what = f"weight push of version {retained.version} to {len(targets)} server(s)"
        if reuse:
            pg = self._main[2]
        else:
            self._wait_keys([key("join", gid, r) for r in range(1, world)], targets, poll, deadline,
                            f"{what}: forming group {gid}", lambda k: _joiner(k, ranks, targets))
            self.store.set(key("join", gid, 0), "1")
            try:
                pg = grp.new_group(self.store, gid, 0, world, self.backend, deadline.left)
            except DistError as e:
                raise WeightSyncError(f"{what}: forming group {gid}: {grp._short(e)}") from e
            if main:
                self._main = (gid, names, pg)
        try:
            grp.send(pg, retained.layout, retained.buffers, tensors, poll, deadline, what)
            return self._acks(seq, targets, poll, deadline, what)
        except WeightSyncError:
            grp.abandon(pg, self.timeout)
            raise

    def _load_cmd(self, seq: int, targets: list[Member], version: int, wid: str,
                  path: Optional[str]) -> dict[str, dict]:
        set_json(self.store, key("cmd", seq), {"seq": seq, "kind": "load", "version": version,
                                               "weights": wid, "path": path,
                                               "targets": [m.instance for m in targets]})
        what = f"loading weights version {version} ({path or 'the model directory'})"
        return self._acks(seq, targets, self._liveness(targets), Deadline(self.timeout), what)

    def _acks(self, seq, targets, poll, deadline, what) -> dict[str, dict]:
        keys = {key("ack", seq, m.instance): m for m in targets}
        self._wait_keys(list(keys), targets, poll, deadline, f"{what}: waiting for acknowledgements",
                        lambda k: keys[k])
        return {m.instance: get_json(self.store, k) for k, m in keys.items()}

    def _wait_keys(self, keys, targets, poll, deadline, what, owner) -> None:
        """Wait until every key is set. Polls often (the push's own latency), checking all keys
        in one round trip; liveness and the deadline are checked every 50 ms."""
        pending = list(keys)
        checked = time.monotonic()
        while pending and not self.store.check(pending):
            time.sleep(ACK_POLL_SECONDS)
            if time.monotonic() - checked < 0.05:
                continue
            checked = time.monotonic()
            pending = [k for k in pending if not self.store.check([k])]
            reason = poll()
            if reason:
                raise WeightSyncError(f"{what}: {reason}")
            if deadline.expired and pending:
                late = ", ".join(sorted({str(owner(k)) for k in pending}))
                raise WeightSyncError(f"{what}: no answer within {deadline.seconds:.0f} s from {late}")

    def _liveness(self, targets: list[Member]):
        def poll() -> Optional[str]:
            for m in targets:
                if m.dead:
                    return f"{m} {m.dead}"
            return None
        return poll

    def _triage(self, seq: int, targets: list[Member], error: WeightSyncError):
        """After a failed command: who is alive (answers the cancelled command) and who is lost."""
        deadline = Deadline(self.heartbeat_timeout + 2)
        pending = {m.instance: m for m in targets}
        alive = []
        while pending and not deadline.expired:
            for inst, m in list(pending.items()):
                if m.dead:
                    pending.pop(inst)
                elif self.store.check([key("ack", seq, inst)]):
                    alive.append(pending.pop(inst))
            time.sleep(grp.POLL_SECONDS)
        lost = [(m, m.dead or f"did not answer after the failure ({error})")
                for m in targets if m not in alive]
        return alive, lost

    # ---- membership ---------------------------------------------------------------------------
    def _live(self) -> list[Member]:
        with self._mlock:
            return sorted((m for m in self._members.values() if not m.dead), key=lambda m: m.index)

    def _drop(self, m: Member, reason: str) -> None:
        m.dead = m.dead or reason
        with self._mlock:
            if self._members.get(m.instance) is m:
                del self._members[m.instance]
        try:
            self.store.set(key("dropped", m.instance), reason)
        except DistError:
            pass

    def _set_current(self, version: int, wid: str) -> None:
        self._current = {"version": version, "weights": wid}
        set_json(self.store, key("current"), self._current)

    def _watch(self) -> None:
        store = None
        while not self._closed.wait(WATCH_SECONDS):
            try:
                store = store or connect(f"{self._local_host}:{self.port}")
                self._scan_registrations(store)
                self._scan_heartbeats(store)
                if self._needs_catch_up() and self._lock.acquire(blocking=False):
                    try:
                        self._catch_up()
                    finally:
                        self._lock.release()
            except (WeightSyncError, DistError) as e:
                if self._closed.is_set():
                    return
                log.warning("weight-sync watcher: %s", e)
                store = None
            except Exception:  # keep watching: a bug here must not silently stop re-joins
                log.exception("weight-sync watcher failed")

    def _scan_registrations(self, store: TCPStore) -> None:
        n = store.add(key("reg", "n"), 0)
        while self._seen_regs < n:
            info = get_json(store, key("reg", self._seen_regs + 1))
            if info is None:  # registered the number, not yet the record: next round
                return
            self._seen_regs += 1
            m = Member(info["instance"], info["replica"], info["url"], int(info.get("workers", 1)),
                       info["weights"], int(info["version"]), self._seen_regs)
            with self._mlock:
                # Same address: the same server slot restarted (a live twin under another address
                # is left alone; a dead one goes when its heartbeats stop).
                old = [o for o in self._members.values() if o.url == m.url]
            for o in old:
                log.info("%s registered again: replacing its previous instance", m)
                self._drop(o, "replaced by a newer registration of the same server")
            with self._mlock:
                self._members[m.instance] = m
            store.set(key("accepted", m.instance), "1")
            log.info("%s registered (holds version %d)", m, m.version)

    def _scan_heartbeats(self, store: TCPStore) -> None:
        now = time.monotonic()
        for m in self._live():
            beat = store.add(key("hb", m.instance), 0)
            if beat != m.hb:
                m.hb, m.hb_at = beat, now
            elif now - m.hb_at > self.heartbeat_timeout:
                why = f"sent no heartbeat for {now - m.hb_at:.1f} s (dead or hung)"
                log.error("%s %s; removing it from the weight-sync group", m, why)
                self._drop(m, why)

    def _needs_catch_up(self) -> bool:
        cur = self._current
        return bool(cur) and any(m.weights != cur["weights"] for m in self._live())

    def _catch_up(self) -> None:
        """Bring servers that registered with other weights to the current version."""
        cur = self._current
        late = [m for m in self._live() if m.weights != cur["weights"]]
        if not late:
            return
        log.info("bringing %s to version %d", ", ".join(str(m) for m in late), cur["version"])
        if cur["weights"] == DISK:  # version 0: the servers reload the model directory
            self._deliver(late, _Retained(bk.Layout(()), [], cur["version"], DISK, None), None,
                          main=False, load=True)
        else:
            self._deliver(late, self._retained, None, main=False, load=self.backend == "checkpoint")

    def _stats(self, version, start, retained, ok, dropped) -> dict:
        return {"version": version, "seconds": time.perf_counter() - start,
                "bytes": retained.layout.nbytes, "buckets": len(retained.layout.buckets),
                "servers": len(ok), "dropped": [m.replica for m in dropped], "backend": self.backend}


def _joiner(k: str, ranks: dict[str, int], targets: list[Member]) -> Member:
    rank = int(k.rsplit("/", 1)[1])
    base = max((b for b in ranks.values() if b <= rank))
    return next(m for m in targets if ranks[m.instance] == base)
