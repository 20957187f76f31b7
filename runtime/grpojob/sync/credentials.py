"""The job's token in weight sync (grpojob.auth): the publisher's private key space, the proof a
registration carries, and the seal on every JSON value written there.

torch's TCPStore authenticates nobody: any process that reaches its port can list every key
(`list_keys`), read, write and delete any of them. So the token itself never goes through the
store, and it does what a shared secret can do there:
- a registration carries a proof: an HMAC under the token over the publisher incarnation's nonce
  (the open `run` key) and the registration itself. `membership.verify` refuses a registration
  without one, with a wrong one, or one seen before (a replay);
- every other key lives under a space derived from the token and the nonce, so a process without
  the token cannot compute where the commands, acknowledgements and groups of this incarnation
  are (it can still list them);
- every JSON value in that space (commands, the current version, acknowledgements, the probe) is
  sealed with an HMAC bound to its key: a command written by anyone else is ignored, so nobody
  without the token can send a rollout server weights, a path to load, or a group to join.
What it cannot do (docs/security.md): keep a process that reaches the store from reading the
keys it lists, or from racing into a collective group's rendezvous; the NetworkPolicy keeps
other pods away from the store and the group ports.
"""
from __future__ import annotations

import json
from typing import Any, Optional

from torch.distributed import TCPStore

from grpojob.auth import Auth
from grpojob.sync.protocol import key

SPACE_CHARS = 32  # hex characters of the derived key space (128 bits)


class Forged(ValueError):
    """A value in the private key space that the job's token did not seal."""


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Credentials:
    """The token as one publisher incarnation (`run`) and its servers use it."""

    def __init__(self, token: str, run: str):
        if not token:
            raise ValueError("weight sync needs the job's token (grpojob.auth)")
        self._auth = Auth(token)
        self.run = run
        self.space = self._auth.mac("weight-sync key space", run)[:SPACE_CHARS]

    def __repr__(self) -> str:
        return f"Credentials(run={self.run!r})"

    def key(self, *parts: Any) -> str:
        return key(self.space, *parts)

    # ---- registrations ------------------------------------------------------------------------
    def prove(self, doc: dict) -> str:
        return self._auth.mac("registration", self.run, canonical(doc))

    def proven(self, doc: dict, proof: Any) -> bool:
        return self._auth.verify_mac(proof, "registration", self.run, canonical(doc))

    # ---- sealed values --------------------------------------------------------------------------
    def seal(self, k: str, value: Any) -> str:
        return json.dumps({"value": value, "mac": self._auth.mac("value", k, canonical(value))})

    def unseal(self, k: str, raw: bytes) -> Any:
        try:
            doc = json.loads(raw)
            value, mac = doc["value"], doc["mac"]
        except (ValueError, TypeError, KeyError):
            raise Forged(f"{k}: not a sealed value") from None
        if not self._auth.verify_mac(mac, "value", k, canonical(value)):
            raise Forged(f"{k}: not sealed with the job's token")
        return value

    def set_json(self, store: TCPStore, k: str, value: Any) -> None:
        store.set(k, self.seal(k, value))

    def get_json(self, store: TCPStore, k: str) -> Optional[Any]:
        """The value under k, or None when it is not set (never blocks); Forged when someone
        without the token wrote it."""
        if not store.check([k]):
            return None
        return self.unseal(k, store.get(k))
