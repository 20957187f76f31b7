"""Each job's token (grpojob.auth), as the operator holds it.

The token lives in the job's Secret (`<job>-token`, owned by the job, immutable): made once with
a fresh random token when the job has none, never patched (its pods read it when they start). The
operator reads it back once per job (after a restart, say) and keeps it in memory by job uid, to
call the trainer's /status and /suspend with it. A look every RECHECK_SECONDS puts a deleted
Secret back with the same token, so pods that start later still get the one the running ones hold.

The token is never logged, never put into status, an Event or the ConfigMap.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

from grpojob import auth

from . import children
from . import names as n
from .kube import Kube, KubeError

log = logging.getLogger("grpojob.operator")

RECHECK_SECONDS = 300.0


class Tokens:
    def __init__(self) -> None:
        self._held: dict[str, tuple[str, float]] = {}  # job uid -> (token, when its Secret was last seen)

    def forget(self, uid: str) -> None:
        self._held.pop(uid, None)

    async def get(self, kube: Kube, job: str, namespace: str, uid: str) -> tuple[Optional[str], str]:
        """(the job's token, "") or (None, why there is none: the job's status says it)."""
        held = self._held.get(uid)
        now = time.monotonic()
        if held and now - held[1] < RECHECK_SECONDS:
            return held[0], ""
        name = n.token_name(job)
        try:
            obj = await kube.get("v1", "Secret", namespace, name)
            if obj is None:
                token = held[0] if held else auth.generate()
                obj = await self._create(kube, job, namespace, uid, token, again=held is not None)
        except KubeError as e:
            return (held[0] if held else None), f"the job's Secret {namespace}/{name}: {e}"
        owners = [o.get("uid") for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")]
        if owners != [uid]:
            return None, (f"Secret {namespace}/{name} exists and is not this GRPOJob's (controller: "
                          f"{owners[0] if owners else 'none'}); delete it and the operator creates its own")
        token = children.secret_token(obj)
        if token is None:
            return None, (f"Secret {namespace}/{name} holds no {auth.TOKEN_KEY}: delete it and the operator creates "
                          f"a new one (the job's pods then need a restart to read it)")
        if held and held[0] != token:
            log.warning("%s/%s: the job's Secret holds another token than before: using it", namespace, job)
        self._held[uid] = (token, now)
        return token, ""

    @staticmethod
    async def _create(kube: Kube, job: str, namespace: str, uid: str, token: str, again: bool) -> dict:
        """Create the Secret; one made meanwhile by another operator replica wins."""
        manifest = children.token_secret(job, namespace, children.owner_reference(job, uid), token)
        try:
            await kube.create(manifest)
        except KubeError as e:
            if e.status != 409:
                raise
            found = await kube.get("v1", "Secret", namespace, n.token_name(job))
            if found is None:
                raise
            return found
        log.info("%s/%s: %s Secret %s (the job's token)", namespace, job, "re-created" if again else "created",
                 n.token_name(job))
        return manifest
