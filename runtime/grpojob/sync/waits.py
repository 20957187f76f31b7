"""Waiting on the rollout servers during a push (trainer rank 0): for keys they set in the store
(acknowledgements, group joins), while watching that each target is alive and did not report a
failed transfer; and after a failed command, finding who is still there (`triage`)."""
from __future__ import annotations

import logging
import time
from typing import Optional

from torch.distributed import TCPStore

from grpojob.sync import group as grp
from grpojob.sync.credentials import Credentials, Forged
from grpojob.sync.membership import Member, Membership
from grpojob.sync.protocol import Deadline, WeightSyncError

log = logging.getLogger("grpojob.sync")

ACK_POLL_SECONDS = 0.00025  # only while a command waits for its acknowledgements (part of a push's fixed cost)
NACK_POLL_SECONDS = 0.05  # a store round trip: not on every 10 ms poll of a transfer


class Waits:
    def __init__(self, store: TCPStore, creds: Credentials, members: Membership):
        self.store, self.creds, self.members = store, creds, members

    def acks(self, seq, targets, poll, deadline, what) -> dict[str, dict]:
        keys = {self.creds.key("ack", seq, m.instance): m for m in targets}
        self.keys(list(keys), poll, deadline, f"{what}: waiting for acknowledgements", lambda k: keys[k])
        return {m.instance: self._ack(k) for k, m in keys.items()}

    def _ack(self, k: str) -> dict:
        """An acknowledgement; one the job's token did not seal counts as a failure to load."""
        try:
            return self.creds.get_json(self.store, k)
        except Forged as e:
            log.error("weight sync: %s (ignored)", e)
            return {"ok": False, "error": "its acknowledgement was not sealed with the job's token"}

    def keys(self, keys, poll, deadline, what, owner) -> None:
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

    def liveness(self, targets: list[Member], nack: Optional[str] = None):
        """A poll: the first target that died, or (for one path's transfer) one that failed to receive."""
        by_instance = {m.instance: m for m in targets}
        checked = [0.0]

        def poll() -> Optional[str]:
            for m in targets:
                if m.dead:
                    return f"{m} {m.dead}"
            if not nack or time.monotonic() - checked[0] < NACK_POLL_SECONDS:
                return None
            checked[0] = time.monotonic()
            if self.store.check([nack]):
                instance, _, error = self.store.get(nack).decode().partition("\n")
                return f"{by_instance.get(instance, instance)} failed to receive: {error}"
            return None
        return poll

    def triage(self, seq: int, targets: list[Member], error: WeightSyncError):
        """After a failed command: who is alive (answers the cancelled command) and who is lost."""
        deadline = Deadline(self.members.heartbeat_timeout + 2)
        pending = {m.instance: m for m in targets}
        alive = []
        while pending and not deadline.expired:
            for inst, m in list(pending.items()):
                if m.dead:
                    pending.pop(inst)
                elif self.store.check([self.creds.key("ack", seq, inst)]):
                    alive.append(pending.pop(inst))
            time.sleep(grp.POLL_SECONDS)
        lost = [(m, m.dead or f"did not answer after the failure ({error})")
                for m in targets if m not in alive]
        return alive, lost
