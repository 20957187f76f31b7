"""Compact views of the objects the operator watches, kept in kopf's in-memory indexes so a
status look costs no API call."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from grpojob import plan
from grpojob.api import plugins

from . import children, judges
from . import names as n
from .status import PodView
from .status.waiting import pod_problem

# Kinds whose watched content is hashed, not just their stamp read: an edit that keeps the
# spec-hash annotation (opening a NetworkPolicy to everyone, say) still shows as drift.
CONTENT_CHECKED = ("NetworkPolicy",)
_KEPT_META = ("name", "namespace", "labels", "annotations", "ownerReferences")


@dataclass(frozen=True)
class ChildView:
    kind: str
    name: str
    hash: str  # the spec-hash annotation we stamped ("" when someone removed it)
    owner_uid: str
    config: Optional[str] = None  # ConfigMap only: the applied runtime config


def _ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _last_exit(status: Mapping[str, Any]) -> str:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated")
        if term:
            text = f"{cs.get('name')} exited {term.get('exitCode')} ({term.get('reason', '')})"
            return text + (f": {term['message']}" if term.get("message") else "")
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return f"{cs.get('name')} {waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
    return status.get("message") or status.get("reason") or ""


def _termination_messages(status: Mapping[str, Any], init: bool = False) -> Iterator[str]:
    """The termination messages of the pod's containers (init containers first when asked), the
    current run's before the last one's."""
    statuses = [*(status.get("initContainerStatuses") or [] if init else []), *(status.get("containerStatuses") or [])]
    for cs in statuses:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            message = (state.get("terminated") or {}).get("message")
            if message:
                yield message


def _first(status: Mapping[str, Any], parse: Callable[[str], Any], init: bool = False) -> Any:
    return next((found for m in _termination_messages(status, init) if (found := parse(m)) is not None), None)


def _own(status: Mapping[str, Any], role: str) -> list[Mapping[str, Any]]:
    """The statuses of the role's own container (a colocated trainer pod also runs the engine's
    container, whose restarts and exits are not the trainer's); all of them when none is named so."""
    every = status.get("containerStatuses") or []
    return [cs for cs in every if cs.get("name") == role] or every


def _clean_exit(status: Mapping[str, Any], role: str) -> bool:
    for cs in _own(status, role):
        term = (cs.get("lastState") or {}).get("terminated")
        return bool(term) and term.get("exitCode") == 0
    return False


def pod_view(meta: Mapping[str, Any], status: Mapping[str, Any],
             spec: Optional[Mapping[str, Any]] = None) -> Optional[tuple[tuple[str, str], PodView]]:
    """(namespace, job) -> PodView for one of our pods, None for anyone else's."""
    labels = meta.get("labels") or {}
    job, role = labels.get(n.LABEL_JOB), labels.get(n.LABEL_ROLE)
    if not job or role not in (*n.ROLES, plan.ENVIRONMENT_ROLE, judges.ROLE):
        return None
    restarts = sum(int(cs.get("restartCount") or 0) for cs in _own(status, role))
    view = PodView(name=meta["name"], uid=meta.get("uid", ""), role=role, phase=status.get("phase") or "Pending",
                   ready=_ready(status), restarts=restarts, message=_last_exit(status),
                   deleting=bool(meta.get("deletionTimestamp")), clean_exit=_clean_exit(status, role),
                   # a plug-in failure, in any container (init containers first)
                   failure=_first(status, plugins.parse_failure, init=True),
                   completed_step=_first(status, plugins.parse_completion) if role == "trainer" else None,
                   # a rollout server's, or a colocated engine's in a trainer pod
                   engine_failure=_first(status, plugins.parse_engine_failure) if role in n.ROLES else None,
                   problem=pod_problem(spec or {}, status))
    return (meta.get("namespace", ""), job), view


def _content_hash(body: Mapping[str, Any]) -> str:
    """The spec hash of the object as it is (only what the operator renders), "" when its stamp
    is gone: equal to the stamp exactly when nobody changed what the operator wrote."""
    meta = body.get("metadata") or {}
    if n.ANN_HASH not in (meta.get("annotations") or {}):
        return ""
    kept = {k: v for k, v in body.items() if k in ("apiVersion", "kind", "spec")}
    kept["metadata"] = {k: meta[k] for k in _KEPT_META if k in meta}
    return children.spec_hash(kept)


def child_view(kind: str, meta: Mapping[str, Any], data: Optional[Mapping[str, Any]] = None,
               body: Optional[Mapping[str, Any]] = None) -> Optional[tuple[tuple[str, str], ChildView]]:
    labels = meta.get("labels") or {}
    job = labels.get(n.LABEL_JOB)
    if not job or labels.get(n.LABEL_MANAGED_BY) != n.MANAGER:
        return None
    owners = [o.get("uid", "") for o in meta.get("ownerReferences") or [] if o.get("controller")]
    config = (data or {}).get(plan.CONFIG_FILE) if kind == "ConfigMap" else None
    stamp = (meta.get("annotations") or {}).get(n.ANN_HASH, "")
    view = ChildView(kind=kind, name=meta["name"],
                     hash=_content_hash(body) if kind in CONTENT_CHECKED and body is not None else stamp,
                     owner_uid=owners[0] if owners else "", config=config)
    return (meta.get("namespace", ""), job), view


def applied_spec(config: Optional[str]) -> Optional[dict[str, Any]]:
    """The spec the job's children were last built from (the ConfigMap's runtime config)."""
    if not config:
        return None
    try:
        doc = json.loads(config)
    except ValueError:
        return None
    return doc.get("spec") if isinstance(doc, dict) else None
