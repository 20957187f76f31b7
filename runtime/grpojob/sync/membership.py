"""Membership: the rollout servers registered with trainer rank 0's weight-sync store.

A watcher thread scans new registrations at the store's open door and takes each through one
gate, `admit`: `verify` (the one place where a registration's credentials are checked: its proof
of the job's token, and that it is not a replay), then the route of every endpoint
(`placement.route`): a server an explicit backend cannot reach is refused, named in the log, and
told why through the store. A refused registration is logged with the address it declares (the
store does not know who wrote a key) and told only "unauthorized" when its proof failed. It also
counts heartbeats and drops a server that stopped beating, or that left (a sealed `leave` key:
a server scaled down, grpojob.sync.agent.SyncAgent.leave). After each round it calls
`after_round` (the publisher brings late servers to the current version there).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from torch.distributed import DistError, TCPStore

from grpojob.sync.credentials import Credentials, Forged
from grpojob.sync.placement import BACKEND_FIELD, Endpoint, PlacementError
from grpojob.sync.protocol import WeightSyncError, connect, door

log = logging.getLogger("grpojob.sync")

WATCH_SECONDS = 0.25
# A registration number taken without its record for this long is skipped: a client that only
# bumps the counter must not hold back every registration after it.
EMPTY_SLOT_SECONDS = 5.0
UNAUTHORIZED = "unauthorized"
# A server that left on its own (stopping: scaled down) finishes the requests it has within its
# drain time (rollout.process.DRAIN_SECONDS, 10 s): it counts as draining this long after it left.
DRAIN_GRACE_SECONDS = 15.0


class Refused(Exception):
    """A registration the publisher does not take; the message says why (`told`: what the
    registrant is told through the store, when not the message)."""

    def __init__(self, message: str, told: Optional[str] = None):
        super().__init__(message)
        self.told = told or message


@dataclass(frozen=True)
class Registration:
    instance: str
    replica: str
    url: str
    endpoints: tuple[Endpoint, ...]
    shares_memory: bool
    version: int
    weights: str
    delta_files: bool = False  # its engine applies delta versions from files (backend checkpoint: `filepush`)
    signed: dict = field(repr=False, compare=False, default_factory=dict)  # what the proof covers
    proof: Optional[str] = field(repr=False, compare=False, default=None)

    @classmethod
    def parse(cls, doc: dict) -> "Registration":
        try:
            if not isinstance(doc, dict):
                raise TypeError("not a JSON object")
            endpoints = tuple(Endpoint.from_json(e) for e in doc["endpoints"])
            if not endpoints:
                raise ValueError("no endpoints")
            signed = {k: v for k, v in doc.items() if k != "proof"}
            return cls(str(doc["instance"]), str(doc["replica"]), str(doc["url"]), endpoints,
                       bool(doc.get("shares_memory")), int(doc["version"]), str(doc["weights"]),
                       doc.get("delta_files") is True, signed, doc.get("proof"))
        except (KeyError, TypeError, ValueError) as e:
            raise Refused(f"malformed registration ({type(e).__name__}: {e}); is this rollout server "
                          f"the trainer's grpojob version?") from e

    def __str__(self) -> str:
        return f"rollout server '{self.replica}' ({self.url})"


@dataclass
class Member:
    reg: Registration
    routes: tuple[str, ...]  # the path of each endpoint
    index: int  # registration order
    weights: str  # weights id it holds
    version: int
    hb: int = -1
    hb_at: float = field(default_factory=time.monotonic)
    dead: Optional[str] = None  # why it was removed

    @property
    def instance(self) -> str:
        return self.reg.instance

    @property
    def replica(self) -> str:
        return self.reg.replica

    @property
    def url(self) -> str:
        return self.reg.url

    def __str__(self) -> str:
        return str(self.reg)


class Membership:
    def __init__(self, store: TCPStore, addr: str, creds: Credentials, *, heartbeat_timeout: float,
                 route: Callable[[Endpoint, bool], str], after_round: Callable[[], None]):
        """`store`: the publisher's own store (writes from any thread); `addr`: where the watcher
        connects its own client; `creds`: the job's token for this incarnation;
        `route(endpoint, shares_memory)`: the path to one endpoint."""
        self.store = store
        self.addr = addr
        self.creds = creds
        self.heartbeat_timeout = heartbeat_timeout
        self.route = route
        self.after_round = after_round
        self.refused: dict[str, str] = {}  # replica -> why its last registration was refused
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self._seen = 0
        self._empty_since: Optional[float] = None  # when the next registration slot was found empty
        self._instances: set[str] = set()  # every instance admitted
        self._departed: dict[str, float] = {}  # url -> when its server left on its own (draining)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="grpojob-sync-watch", daemon=True)

    def start(self) -> "Membership":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self.store = None  # the publisher's store shuts down with its last reference

    def all(self) -> list[Member]:
        with self._lock:
            return sorted(self._members.values(), key=lambda m: m.index)

    def live(self) -> list[Member]:
        return [m for m in self.all() if not m.dead]

    def draining(self) -> list[str]:
        """URLs of servers that left on their own within DRAIN_GRACE_SECONDS: they finish the
        requests they have (a dropped server, dead or hung, is not among them)."""
        now = time.monotonic()
        with self._lock:
            self._departed = {u: t for u, t in self._departed.items() if now - t <= DRAIN_GRACE_SECONDS}
            return list(self._departed)

    def drop(self, m: Member, reason: str) -> None:
        m.dead = m.dead or reason
        with self._lock:
            if self._members.get(m.instance) is m:
                del self._members[m.instance]
        try:
            self.store.set(self.creds.key("dropped", m.instance), reason)
        except DistError:
            pass

    # ---- admission ----------------------------------------------------------------------------
    def verify(self, reg: Registration) -> None:
        """Whether this registration may join: it proves the job's token for this incarnation
        (`credentials`), and its instance has not registered before (a copy of someone else's
        registration proves the token too)."""
        if reg.proof is None:
            raise Refused(f"{UNAUTHORIZED}: the registration carries no proof of the job's token", UNAUTHORIZED)
        if not self.creds.proven(reg.signed, reg.proof):
            raise Refused(f"{UNAUTHORIZED}: its proof was not made with the job's token (for this trainer "
                          f"incarnation)", UNAUTHORIZED)
        if reg.instance in self._instances:
            raise Refused(f"{UNAUTHORIZED}: instance {reg.instance} registered before (a replayed registration)",
                          UNAUTHORIZED)

    def admit(self, reg: Registration, index: int) -> Member:
        """The member for a registration, with a route per endpoint; Refused says why not."""
        self.verify(reg)
        routes = []
        for i, ep in enumerate(reg.endpoints):
            try:
                routes.append(self.route(ep, reg.shares_memory))
            except PlacementError as e:
                where = f"endpoint {i} ({ep})" if len(reg.endpoints) > 1 else f"it computes on {ep}"
                raise Refused(f"{BACKEND_FIELD}: {e} [{where}]") from e
        self._instances.add(reg.instance)  # taken: a copy of it is a replay
        return Member(reg, tuple(routes), index, reg.weights, reg.version)

    # ---- the watcher ----------------------------------------------------------------------------
    def _watch(self) -> None:
        store = None
        while not self._closed.wait(WATCH_SECONDS):
            try:
                store = store or connect(self.addr)
                self._scan_registrations(store)
                self._scan_heartbeats(store)
                self.after_round()
            except (WeightSyncError, DistError) as e:
                if self._closed.is_set():
                    return
                log.warning("weight-sync watcher: %s", e)
                store = None
            except Exception:  # keep watching: a bug here must not silently stop re-joins
                log.exception("weight-sync watcher failed")

    def _scan_registrations(self, store: TCPStore) -> None:
        n = store.add(door("reg", "n"), 0)
        while self._seen < n:
            slot = door("reg", self._seen + 1)
            if not store.check([slot]):  # registered the number, not yet the record: next round
                now = time.monotonic()
                self._empty_since = self._empty_since or now
                if now - self._empty_since < EMPTY_SLOT_SECONDS:
                    return
                self._skip_empty(store, n)
                continue
            self._empty_since = None
            self._seen += 1
            raw = store.get(slot)
            try:
                doc = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                doc = None
            doc = doc if isinstance(doc, dict) else {}
            instance = str(doc.get("instance", f"unnamed-{self._seen}"))
            try:
                reg = Registration.parse(doc)
                m = self.admit(reg, self._seen)
            except Refused as e:
                replica, url = _shown(doc.get("replica", instance)), _shown(doc.get("url", "?"))
                log.error("rollout server '%s' (declares %s) is refused: %s", replica, url, e,
                          extra={"declared_url": url})
                if len(self.refused) < 1000:  # what status shows; not a sink for a flood of bad ones
                    self.refused[replica] = str(e)
                if instance not in self._instances:  # a copy of a member's registration tells the member nothing
                    store.set(door("refused", instance), e.told)
                continue
            # Same address: the same server slot restarted (a live twin under another address
            # is left alone; a dead one goes when its heartbeats stop).
            for old in [o for o in self.all() if o.url == m.url]:
                log.info("%s registered again: replacing its previous instance", m)
                self.drop(old, "replaced by a newer registration of the same server")
            with self._lock:
                self._members[m.instance] = m
            self.refused.pop(m.replica, None)
            store.set(self.creds.key("accepted", m.instance), "1")
            log.info("%s registered (holds version %d; %s)", m, m.version,
                     ", ".join(f"{ep} via {r}" for ep, r in zip(reg.endpoints, m.routes)))

    def _skip_empty(self, store: TCPStore, n: int) -> None:
        """Past the empty slots up to the next record there is: a client that bumped the counter
        by a million must not hold back the registrations after it."""
        prefix = door("reg", "")
        taken = [int(k[len(prefix):]) for k in store.list_keys()
                 if k.startswith(prefix) and k[len(prefix):].isdecimal()]
        nxt = min((i for i in taken if i > self._seen), default=n + 1)
        log.warning("registration slots %d..%d stayed empty for %.0f s: skipped", self._seen + 1, nxt - 1,
                    EMPTY_SLOT_SECONDS)
        self._seen = nxt - 1
        self._empty_since = None

    def _scan_heartbeats(self, store: TCPStore) -> None:
        now = time.monotonic()
        for m in self.live():
            if (left := self._left(store, m)) is not None:
                log.info("%s left the weight-sync group (%s)", m, left)
                with self._lock:
                    self._departed[m.url] = now
                self.drop(m, f"left ({left})")
                continue
            beat = store.add(self.creds.key("hb", m.instance), 0)
            if beat != m.hb:
                m.hb, m.hb_at = beat, now
            elif now - m.hb_at > self.heartbeat_timeout:
                why = f"sent no heartbeat for {now - m.hb_at:.1f} s (dead or hung)"
                log.error("%s %s; removing it from the weight-sync group", m, why)
                self.drop(m, why)


    def _left(self, store: TCPStore, m: Member) -> Optional[str]:
        """Why m left (its sealed `leave` key), or None; a forged one is ignored."""
        try:
            reason = self.creds.get_json(store, self.creds.key("leave", m.instance))
        except Forged:
            return None
        return None if reason is None else _shown(reason)


def _shown(value: object, limit: int = 200) -> str:
    """A value a registrant chose, safe for a log line: printable, and not too long."""
    text = "".join(ch if ch.isprintable() else "?" for ch in str(value))
    return text if len(text) <= limit else text[:limit] + "..."
