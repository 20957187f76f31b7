"""SyncAgent: a rollout server's side of weight sync (a background thread).

It connects to the trainer's store (retrying for as long as the server lives: the trainer may
start later or restart), registers the server with a proof of the job's token (`credentials`;
the rest of the conversation lives in the key space the token derives, and it acts only on
commands sealed with the token) and its endpoints (where each receiving process
computes, and whether it shares memory with the trainer: the publisher routes each push by
them), heartbeats, and applies the commands that name it through a `WeightSink` (the engine).
Readiness (`ready()`): the server holds the weights the publisher calls current. When the trainer
restarts, the agent re-registers with the new store and is brought to the new trainer's current
version before it reports ready again. A registration the trainer refuses (an explicit backend
that cannot reach this server) leaves the server not ready, with the reason, until the trainer
restarts. A server that stops (scaled down) `leave`s: the publisher drops it at once, so no push
waits for its heartbeats to run out and the trainer's client stops sending it requests.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Optional

from torch.distributed import DistError

from grpojob import devices
from grpojob.sync import placement
from grpojob.sync.credentials import Credentials, Forged
from grpojob.contracts.protocols import WeightSink
from grpojob.sync.protocol import DISK, WeightSyncError, connect, door, set_json, wait_key

log = logging.getLogger("grpojob.sync")

HOT_SECONDS = 120.0  # after a command, poll for the next one often (HOT_POLL) for this long, else every 50 ms
# The poll's interval is the push's fixed cost (half of it on average): on a GPU a whole push of a
# small model over cuda-ipc takes a few ms, so poll every 0.5 ms there (a store round trip of about
# 30 us each: a few % of one of a GPU node's cores); a CPU engine keeps its cores.
HOT_POLL_SECONDS = {"cuda": 0.0005, "cpu": 0.005}


class SyncAgent:
    def __init__(self, sink: WeightSink, store_addr: str, *, token: str, replica: str, url: str, model_dir: str,
                 checkpoint_dir: Optional[str] = None, heartbeat_seconds: float = 1.0,
                 connect_timeout: float = 10.0, delta_files: bool = False):
        """`token`: the job's token (grpojob.auth), proven to the publisher at registration;
        `delta_files`: the sink's `load_dir` also applies delta versions (`files.read_delta`) onto
        the weights it holds (backend checkpoint with weightSync.delta)."""
        if not token:
            raise ValueError("SyncAgent needs the job's token (grpojob.auth)")
        self.sink = sink
        self._token = token
        self.addr = store_addr
        self.replica = replica
        self.url = url
        self.model_dir = model_dir
        self.checkpoint_dir = checkpoint_dir
        self.delta_files = delta_files
        self.heartbeat_seconds = heartbeat_seconds
        self.connect_timeout = connect_timeout
        self.held: tuple[int, str] = (0, DISK)  # the engine starts from the model directory
        self.current: Optional[dict] = None
        self.connected = False
        self.accepted = False  # the publisher has us in its table
        self._confirming: Optional[str] = None  # weights applied, until the store's current says so
        self.instance: Optional[str] = None
        self._creds: Optional[Credentials] = None  # the current session's (leave)
        self.last_sync_seconds: Optional[float] = None
        self.last_error: Optional[str] = None  # the last failed command, for logs and tests
        self.refused: Optional[str] = None  # why the trainer refused this registration
        self._forged: set[str] = set()  # keys holding a value the token did not seal (logged once)
        self._layouts: dict[str, dict] = {}  # layout id -> its JSON (`_layout`)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpojob-sync-agent", daemon=True)

    # ---- public -----------------------------------------------------------------------------
    def start(self) -> "SyncAgent":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop; wait up to `timeout` s for the thread (a daemon: one blocked in a store call is left)."""
        self._stop.set()
        self._thread.join(timeout=timeout)

    def leave(self, reason: str, timeout: float = 2.0) -> None:
        """Leave the weight-sync group for good (the server is stopping): stop, and tell the publisher
        through a sealed `leave` key, which its watcher reads within a scan (membership)."""
        self._stop.set()  # the session ends and does not register again
        instance, creds = self.instance, self._creds
        if instance is not None and creds is not None:
            try:
                creds.set_json(connect(self.addr, self.connect_timeout), creds.key("leave", instance), reason)
                log.info("replica %s left the weight-sync group (%s)", self.replica, reason)
            except (WeightSyncError, DistError) as e:  # the trainer is gone: nothing to leave
                log.info("replica %s: could not tell the trainer it leaves (%s)", self.replica, e)
        self._thread.join(timeout=timeout)

    def ready(self) -> bool:
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> Optional[str]:
        if not self.connected:
            return f"waiting for the trainer's weight-sync store at {self.addr}"
        cur = self.current
        if self.refused:
            return f"the trainer refused this server: {self.refused}"
        if not self.accepted:
            return "registered; waiting for the trainer to accept the registration"
        if cur is None:
            return "registered; the trainer has not published a version yet"
        if cur["weights"] != self.held[1]:
            return f"holds version {self.held[0]}; the trainer's current version is {cur['version']}"
        return None

    # ---- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        outage_logged = False
        drops = 0
        while not self._stop.is_set():
            try:
                store = connect(self.addr, self.connect_timeout)
                outage_logged = False
                dropped = self._session(store)
                if dropped:
                    drops += 1
                    self._stop.wait(min(30.0, 0.5 * 2 ** drops))
                else:
                    drops = 0
            except (WeightSyncError, DistError) as e:
                cause = str(e).splitlines()[0] if str(e) else type(e).__name__
                if self.connected:
                    log.warning("replica %s: lost the trainer's weight-sync store at %s (%s); reconnecting",
                                self.replica, self.addr, cause)
                elif not outage_logged:
                    log.warning("replica %s: %s; retrying", self.replica, cause)
                outage_logged = True
                self.connected = False
                self._stop.wait(1.0)
            except Exception:
                log.exception("replica %s: weight-sync agent failed; restarting it", self.replica)
                self.connected = False
                self._stop.wait(1.0)

    def _session(self, store) -> bool:
        """One registration with one store; returns True when the publisher dropped us."""
        if not store.check([door("run")]):
            raise WeightSyncError(f"the trainer's weight-sync store at {self.addr} is not set up yet")
        creds = self._creds = Credentials(self._token, store.get(door("run")).decode())
        self.instance = f"{self.replica}-{uuid.uuid4().hex[:6]}"
        self.accepted, self.refused, self.current, self._confirming = False, None, None, None
        next_seq = store.add(creds.key("cmd", "n"), 0) + 1  # commands before registering never name us
        version, weights = self.held
        endpoints = [e.to_json() for e in self.sink.endpoints()]
        shared = placement.shares_memory(self._sealed(store, creds, creds.key("probe")))
        doc = {"instance": self.instance, "replica": self.replica, "url": self.url, "endpoints": endpoints,
               "shares_memory": shared, "version": version, "weights": weights, "delta_files": self.delta_files}
        doc["proof"] = creds.prove(doc)
        i = store.add(door("reg", "n"), 1)
        set_json(store, door("reg", i), doc)
        self.current = self._sealed(store, creds, creds.key("current"))
        self.connected = True
        log.info("replica %s registered with the trainer at %s as %s (holds version %d)",
                 self.replica, self.addr, self.instance, version)
        beat_stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(creds.key("hb", self.instance), beat_stop),
                                daemon=True)
        beat.start()
        last_cmd = time.monotonic()
        hot_poll = HOT_POLL_SECONDS["cuda" if any(e["device"] == "cuda" for e in endpoints) else "cpu"]
        try:
            while not self._stop.is_set():
                # The door is open to anyone: once accepted, a refusal there is not the trainer's.
                if self.refused or (not self.accepted and store.check([door("refused", self.instance)])):
                    self._refused(store)
                    continue
                dropped = creds.key("dropped", self.instance)
                reason = store.get(dropped).decode() if store.check([dropped]) else None
                if reason:
                    log.warning("replica %s was removed from the weight-sync group (%s); "
                                "registering again", self.replica, reason)
                    return True
                # Poll for the next command: often while pushes are coming (each step), slowly when
                # idle (the store's blocking wait logs a C++ warning on every timeout).
                hot = time.monotonic() - last_cmd < HOT_SECONDS
                if wait_key(store, creds.key("cmd", next_seq), 0.5, interval=hot_poll if hot else 0.05):
                    cmd = self._sealed(store, creds, creds.key("cmd", next_seq))
                    if cmd is not None and self.instance in cmd["targets"]:
                        self._apply(store, creds, cmd)
                    next_seq += 1
                    last_cmd = time.monotonic()
                current = self._sealed(store, creds, creds.key("current"), self.current)
                if self._confirming and (current or {}).get("weights") != self._confirming:
                    current = self.current  # the publisher sets it once every ack is in
                else:
                    self._confirming = None
                self.current = current
                self.accepted = self.accepted or store.check([creds.key("accepted", self.instance)])
            return False
        finally:
            beat_stop.set()

    def _sealed(self, store, creds: Credentials, k: str, otherwise=None):
        """The sealed value under k (None when unset); a value the job's token did not seal is
        logged (once per key) and ignored: nobody without the token can command this server."""
        try:
            value = creds.get_json(store, k)
        except Forged as e:
            if k not in self._forged:
                self._forged.add(k)
                log.error("replica %s: ignored %s", self.replica, e)
            return otherwise
        self._forged.discard(k)
        return value

    def _refused(self, store) -> None:
        """Refused: say why once, then idle until the store goes (a new trainer may accept us)."""
        if not self.refused:
            self.refused = store.get(door("refused", self.instance)).decode()
            log.error("replica %s: the trainer refused this server: %s", self.replica, self.refused)
        self._stop.wait(1.0)
        store.check([door("run")])  # raises once the trainer's store is gone

    def _apply(self, store, creds: Credentials, cmd: dict) -> None:
        start = time.monotonic()
        ack: dict = {"version": cmd["version"]}
        try:
            if cmd["kind"] == "push":  # the receivers find the command's keys in our space
                lid = cmd["layout"]
                self.sink.receive_push({**cmd, "keyspace": creds.space, "layout_id": lid,
                                        "layout": self._layout(store, creds, lid)}, self.addr, self.instance)
            else:
                path = self.model_dir if cmd["path"] is None else self._checkpoint_path(cmd["path"])
                base = cmd.get("base")  # a delta version: only onto the weights it was taken against
                if base is not None and base != self.held[1]:
                    ack["wrong_base"] = True  # the publisher sends the version whole at once
                    raise WeightSyncError(f"weights version {cmd['version']} on disk is a delta against {base}, "
                                          f"but this server holds {self.held[1]}")
                self.sink.load_dir(path, cmd["version"], cmd["weights"])
            self.held = (cmd["version"], cmd["weights"])
            # The publisher makes a version current once it has delivered it (to whoever survived),
            # so holding it is being in sync; the store's `current` confirms it a moment later.
            self.current = {"version": cmd["version"], "weights": cmd["weights"]}
            self._confirming = cmd["weights"]
            self.last_sync_seconds = time.monotonic() - start
            ack.update(ok=True, seconds=self.last_sync_seconds, paused_seconds=self.sink.last_pause_seconds)
        except WeightSyncError as e:
            log.error("replica %s: %s", self.replica, e)
            self.last_error = str(e)
            ack.update(ok=False, error=str(e))
        except Exception as e:
            log.exception("replica %s: loading weights version %d failed", self.replica, cmd["version"])
            self.last_error = f"loading weights version {cmd['version']} failed: {type(e).__name__}: {e}"
            ack.update(ok=False, error=f"{type(e).__name__}: {e}")
        try:
            creds.set_json(store, creds.key("ack", cmd["seq"], self.instance), ack)
        except DistError:
            pass  # the store is gone: the session loop notices
        if ack["ok"]:  # logged after the ack: the trainer is waiting for it
            log.info("replica %s now serves weights version %d (%s in %.3f s)", self.replica,
                     cmd["version"], cmd["kind"], self.last_sync_seconds)
        devices.release_cpu_threads()  # this thread's copies made an OpenMP team: not the engine's to compete with

    def _layout(self, store, creds: Credentials, lid: str) -> dict:
        """The layout a push command names, read from the store once per id (`delivery._layout_id`)."""
        if lid not in self._layouts:
            doc = self._sealed(store, creds, creds.key("layout", lid))
            if doc is None:
                raise WeightSyncError(f"the trainer's push names layout {lid}, which its store does not hold "
                                      f"sealed with the job's token")
            self._layouts = {lid: doc}  # one at a time: a new layout replaces the old
        return self._layouts[lid]

    def _checkpoint_path(self, rel: str) -> str:
        if not self.checkpoint_dir:
            raise WeightSyncError("weightSync.backend checkpoint: this rollout server has no checkpoint "
                                  "directory (GRPOJOB_CHECKPOINT_DIR) to read the weights from")
        return os.path.join(self.checkpoint_dir, rel)

    def _heartbeat(self, beat_key: str, stop: threading.Event) -> None:
        store = None
        while not stop.wait(self.heartbeat_seconds) and not self._stop.is_set():
            try:
                store = store or connect(self.addr, self.connect_timeout)
                store.add(beat_key, 1)
            except (WeightSyncError, DistError):
                store = None
