"""One reconcile of one GRPOJob: observe, decide (status.decide), act, record.

Every handler (create, resume, spec update, the status timer) runs this same function, serialised
per job, so a restart at any point converges to the same children: names are fixed, an existing
child is patched instead of re-created, and a child whose spec hash already matches is left alone.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional

import kopf

from grpojob.api import API_VERSION, KIND, GRPOJob, GRPOJobStatus, check
from grpojob.api.colocation import COLOCATED
from grpojob.plan import ENVIRONMENT_ROLE

from . import changes, children, judges, network
from . import names as n
from .config import OperatorConfig
from .kube import Kube, KubeError
from .metrics import OperatorMetrics
from .status import (Decision, Observation, PodView, decide, parse_status, transitions, with_children,
                     with_suspend_request)
from .tokens import Tokens
from .trainer_client import TrainerClient
from .views import ChildView, applied_spec

log = logging.getLogger("grpojob.operator")

INDEXED_KINDS = ("ConfigMap", "Service", "StatefulSet", "Deployment", "NetworkPolicy")
# Children a job runs without (kind -> the field asking for it): left out, with a warning, when the
# cluster does not serve their kind.
OPTIONAL_KINDS = {"PodMonitor": "spec.monitoring.podMonitor"}
OPTIONAL_RETRY_SECONDS = 300.0  # look for a missing optional kind again after this long
DELETED = "deleted"  # in Controller._applied: a child this process deleted (no spec hash is this)


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch turning `old` into `new` (None deletes a key)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {}
    for k in old.keys() - new.keys():
        out[k] = None
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_patch(old[k], v)
    return out


def parse_job(name: str, namespace: str, spec: Any) -> tuple[Optional[GRPOJob], list]:
    """The job as the runtime will see it: only name and namespace of the metadata (labels,
    annotations and resourceVersions would churn the runtime config), plugins unresolved."""
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
           "spec": spec}
    job, errors = check(doc, resolve_plugins=False)
    if job is not None:
        errors = children.cluster_errors(job)
        if errors:
            job = None
    return job, errors


def _ledger(annotations: Mapping[str, str]) -> dict[str, int]:
    try:
        raw = json.loads(annotations.get(n.ANN_LEDGER, "{}"))
        return {str(k): int(v) for k, v in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


class Controller:
    def __init__(self, cfg: OperatorConfig, kube: Optional[Kube] = None,
                 metrics: Optional[OperatorMetrics] = None, trainer: Optional[TrainerClient] = None):
        self.cfg = cfg
        self.kube = kube
        self.metrics = metrics or OperatorMetrics()
        self.trainer = trainer or TrainerClient(cfg.trainer_url, cfg.trainer_timeout)
        self.tokens = Tokens()
        self._locks: dict[str, asyncio.Lock] = {}
        # What this process last wrote per job uid (status, ledger): kopf's body may lag behind it.
        self._written: dict[str, tuple[dict[str, Any], dict[str, int]]] = {}
        # Children applied by this process: (kind, ns, name) -> (hash, monotonic time). Covers the
        # moments before the watch shows them, and kinds not watched (PodGroup, PodMonitor).
        self._applied: dict[tuple[str, str, str], tuple[str, float]] = {}
        self._built: dict[str, tuple[Any, list[dict[str, Any]]]] = {}  # uid -> (inputs, children)
        # Optional kinds the cluster does not serve: (apiVersion, kind) -> (why, monotonic time seen).
        self._unserved: dict[tuple[str, str], tuple[str, float]] = {}
        self._gone: dict[str, set[str]] = {}  # job uid -> uids of pods the API server no longer has
        self.watch_lag_grace = 10.0

    async def start(self) -> None:
        if self.kube is None:
            self.kube = await Kube.connect()
        if self.cfg.metrics_port is not None:
            await self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_host)

    async def stop(self) -> None:
        await self.trainer.close()
        await self.metrics.stop()
        if self.kube is not None:
            await self.kube.close()

    def forget(self, uid: str, namespace: str, name: str) -> None:
        self._locks.pop(uid, None)
        self._written.pop(uid, None)
        built = self._built.pop(uid, None)
        self._gone.pop(uid, None)
        self.tokens.forget(uid)
        mine = {name, n.config_name(name), n.trainer_name(name), n.rollout_name(name), *network.names(name)}
        mine |= {o["metadata"]["name"] for o in (built[1] if built else ())}  # environments' Deployments
        removed = judges.name(name, "")  # judges deleted from the spec: their names are in no build
        for key in [k for k in self._applied if k[1] == namespace and (k[2] in mine or k[2].startswith(removed))]:
            self._applied.pop(key, None)
        self.metrics.forget(namespace, name)

    async def reconcile(self, *, body: Mapping[str, Any], pods: Iterable[PodView],
                        kids: Iterable[ChildView], now: Optional[datetime] = None) -> Decision:
        meta = body["metadata"]
        uid = meta["uid"]
        lock = self._locks.setdefault(uid, asyncio.Lock())
        started = time.monotonic()
        result = "error"
        try:
            async with lock:
                d = await self._reconcile(body, list(pods), list(kids), now or datetime.now(timezone.utc))
            result = "invalid" if not d.ensure_children else "success"
            return d
        finally:
            self.metrics.reconciled(result, time.monotonic() - started)

    async def _reconcile(self, body: Mapping[str, Any], pods: list[PodView], kids: list[ChildView],
                         now: datetime) -> Decision:
        assert self.kube is not None, "Controller.start() was not called"
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        written = self._written.get(uid)
        raw_status = written[0] if written else dict(body.get("status") or {})
        ledger = written[1] if written else _ledger(meta.get("annotations") or {})
        prev = parse_status(raw_status, now)

        job, errors = parse_job(name, namespace, body.get("spec"))
        mine = [k for k in kids if k.owner_uid == uid]
        config = next((k.config for k in mine if k.kind == "ConfigMap"), None)
        state = ("finished" if prev.phase in ("Succeeded", "Failed") and not errors else
                 "suspended" if any(c.type == "Suspended" and c.status == "True" for c in prev.conditions)
                 else "active")
        applied = changes.applied_job({"name": name, "namespace": namespace}, applied_spec(config))
        if errors and applied is not None and state == "active":
            # A bad edit of a running job: refuse it, keep running on what was applied.
            rejected = [f"{e}: not applied, the job keeps its running spec" for e in errors]
            job, errors, reason = applied, [], "InvalidUpdate"
        else:
            job, rejected = changes.effective(job, applied, state)
            reason = "ImmutableFieldChanged"

        pods = await self._confirmed(uid, namespace, name, prev, pods)
        trainer_pods = sorted((p for p in pods if p.role == "trainer"), key=lambda p: p.name)
        # spec.placement colocated: the engine is a container of the trainer pods, ready with them.
        rollout_pods = trainer_pods if job is not None and job.spec.placement == COLOCATED else \
            [p for p in pods if p.role == "rollout"]
        environment_pods = [p for p in pods if p.role == ENVIRONMENT_ROLE]
        judge_pods = sorted((p for p in pods if p.role == judges.ROLE), key=lambda p: p.name)
        token, token_error = None, ""
        if job is not None and prev.phase not in ("Succeeded", "Failed"):
            token, token_error = await self.tokens.get(self.kube, name, namespace, uid)
        trainer, trainer_error = None, ""
        if job is not None and prev.phase not in ("Succeeded", "Failed") and any(
                p.name == f"{n.trainer_name(name)}-0" and p.phase == "Running" for p in trainer_pods):
            if token is None:
                trainer_error = f"no token to ask the trainer with: {token_error}"
            else:
                trainer, trainer_error = await self.trainer.status(name, namespace, job.spec.trainer.port, token)
        obs = Observation(now=now, trainer_pods=trainer_pods, rollout_pods=rollout_pods, trainer=trainer,
                          trainer_error=trainer_error, ledger=ledger, environment_pods=environment_pods,
                          judge_pods=judge_pods)
        d = decide(job, prev, obs, generation=meta.get("generation"), errors=errors, rejected=rejected,
                   rejected_reason=reason, suspend_timeout=self.cfg.suspend_timeout)

        if d.request_suspend and job is not None:
            why = (await self.trainer.suspend(name, namespace, job.spec.trainer.port, token) if token
                   else f"no token to ask the trainer with: {token_error}")
            log.log(logging.WARNING if why else logging.INFO, "%s/%s: asked the trainer to checkpoint and stop%s",
                    namespace, name, f" (failed: {why})" if why else "")
            d = with_suspend_request(d, why, now)

        if d.delete_job:
            log.info("%s/%s: finished %s ago or more: deleting (ttlSecondsAfterFinished)", namespace, name,
                     job.spec.run_policy.ttl_seconds_after_finished if job else "?")
            kopf.event(body, type="Normal", reason="TTLExpired", message="deleting the finished job")
            await self.kube.delete_job(namespace, name)
            self.forget(uid, namespace, name)
            return d

        if d.ensure_children and job is not None:
            if token_error and token is None:  # the pods would mount a Secret that is not there
                ok, message, warnings = False, token_error, []
            else:
                ok, message, warnings = await self._ensure_children(job, namespace, uid, d, kids)
            d = with_children(d, ok, message, now, warnings)

        await self._record(body, prev, raw_status, d, ledger)
        return d

    async def _confirmed(self, uid: str, namespace: str, name: str, prev: GRPOJobStatus,
                         pods: list[PodView]) -> list[PodView]:
        """The job's pods, with those of a role scaled to zero checked against the API server.

        kopf's index drops a pod on its DELETED event; a watch that ends and re-lists never sees the
        delete of a pod that went meanwhile (kopf re-lists what exists and forgets nothing), so the
        index may keep a pod that is gone, and a scaled-down job would show it ready for ever. So
        while a role is scaled to zero and the index still shows a pod of it, one list of the
        job's pods says which are there; the others are dropped for good."""
        gone = self._gone.setdefault(uid, set())
        pods = [p for p in pods if p.uid not in gone]
        idle = {role for role, r in (("trainer", prev.trainer), ("rollout", prev.rollout)) if r.desired == 0}
        suspect = [p for p in pods if p.role in idle and not p.deleting]
        if not suspect:
            return pods
        try:
            live = {(p.get("metadata") or {}).get("uid") for p in
                    await self.kube.list_pods(namespace, f"{n.LABEL_JOB}={name}")}
        except KubeError as e:
            log.warning("%s/%s: could not list the job's pods: %s", namespace, name, e)
            return pods
        stale = {p.uid for p in suspect if p.uid not in live}
        if stale:
            log.info("%s/%s: %d pods of the watch are gone from the API server: dropped", namespace, name, len(stale))
            gone |= stale
        return [p for p in pods if p.uid not in stale]

    async def _ensure_children(self, job: GRPOJob, namespace: str, uid: str, d: Decision,
                               have: list[ChildView]) -> tuple[bool, str, list[str]]:
        """Create or repair every child: (all in place, message, optional children left out)."""
        if not network.wanted(job):  # turned off: the job's policies go (a failed delete: next look)
            for policy in [k.name for k in have if k.kind == "NetworkPolicy" and k.owner_uid == uid]:
                try:
                    await self.kube.delete(network.NETWORKING_API, "NetworkPolicy", namespace, policy)
                except KubeError as e:
                    self.metrics.child_error("NetworkPolicy")
                    return False, str(e), []
                self._applied.pop(("NetworkPolicy", namespace, policy), None)
                log.info("%s/%s: deleted NetworkPolicy %s (spec.network.policy: false)", namespace,
                         job.metadata.name, policy)
        failed = await self._delete_removed_judges(job, namespace, uid, have)
        if failed:
            return False, failed, []
        # Rebuilding and hashing every child on every tick is most of a quiet reconcile's cost.
        key = (job.model_dump_json(), d.scale, self.cfg.image)
        cached = self._built.get(uid)
        if cached and cached[0] == key:
            wanted = cached[1]
        else:
            wanted = children.build(job, namespace=namespace, image=self.cfg.image, cluster=self.cfg.cluster,
                                    owner=children.owner_reference(job.metadata.name, uid), scale=d.scale)
            self._built[uid] = (key, wanted)
        present = {(k.kind, k.name): k.hash for k in have if k.owner_uid == uid}
        foreign = {(k.kind, k.name): k.owner_uid for k in have if k.owner_uid != uid}
        errors, warnings = [], []
        clock = time.monotonic()
        for obj in wanted:
            kind, cname = children.key(obj)
            if (kind, cname) in foreign:
                # Never take over another controller's object (nor an orphan): that would change its
                # owner references, which needs delete on it under OwnerReferencesPermissionEnforcement.
                owner = foreign[(kind, cname)]
                errors.append(f"{kind} {namespace}/{cname} exists and is not this GRPOJob's (controller: "
                              f"{owner or 'none'}); delete it and the operator creates its own")
                continue
            h = obj["metadata"]["annotations"][n.ANN_HASH]
            if present.get((kind, cname)) == h:
                continue
            recent = self._applied.get((kind, namespace, cname))
            if recent and recent[0] == h and (kind not in INDEXED_KINDS or clock - recent[1] < self.watch_lag_grace):
                continue
            unserved = self._unserved.get((obj["apiVersion"], kind))
            if unserved and clock - unserved[1] < OPTIONAL_RETRY_SECONDS:
                warnings.append(unserved[0])
                continue
            try:
                how = await self.kube.apply(obj)
                self._applied[(kind, namespace, cname)] = (h, clock)
                self._unserved.pop((obj["apiVersion"], kind), None)
                log.info("%s/%s: %s %s %s", namespace, job.metadata.name, how, kind, cname)
            except KubeError as e:
                self.metrics.child_error(kind)
                if kind in OPTIONAL_KINDS and e.unserved_kind:
                    why = (f"{kind} left out: this cluster does not serve {obj['apiVersion']} (install its CRDs, "
                           f"or set {OPTIONAL_KINDS[kind]}: false); looking again every "
                           f"{OPTIONAL_RETRY_SECONDS:.0f}s")
                    self._unserved[(obj["apiVersion"], kind)] = (why, clock)
                    warnings.append(why)
                else:
                    errors.append(str(e))
                log.warning("%s/%s: %s", namespace, job.metadata.name, e)
        if errors:
            return False, "; ".join(errors), warnings
        return True, f"{len(wanted) - len(warnings)} child objects in place", warnings

    async def _delete_removed_judges(self, job: GRPOJob, namespace: str, uid: str, have: list[ChildView]) -> str:
        """A judge gone from spec.judges (an edit while suspended) takes its Deployment and Service
        with it, the last one the judges' NetworkPolicy. Returns why a delete failed ("" when none
        did; the next look tries again)."""
        clock = time.monotonic()
        for api, kind, child in judges.stale(job, [(k.kind, k.name) for k in have if k.owner_uid == uid]):
            recent = self._applied.get((kind, namespace, child))
            if recent and recent[0] == DELETED and clock - recent[1] < self.watch_lag_grace:
                continue  # deleted already; the watch has not shown it gone yet
            try:
                await self.kube.delete(api, kind, namespace, child)
            except KubeError as e:
                self.metrics.child_error(kind)
                log.warning("%s/%s: %s", namespace, job.metadata.name, e)
                return f"{kind} {namespace}/{child} of a judge removed from spec.judges: {e}"
            self._applied[(kind, namespace, child)] = (DELETED, clock)
            log.info("%s/%s: deleted %s %s (its judge is no longer in spec.judges)", namespace, job.metadata.name,
                     kind, child)
        return ""

    async def _record(self, body: Mapping[str, Any], prev: GRPOJobStatus, raw_status: dict[str, Any],
                      d: Decision, ledger: dict[str, int]) -> None:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        new_raw = d.status.dump()
        if new_raw != raw_status:
            await self.kube.patch_job_status(namespace, name, merge_patch(raw_status, new_raw))
        if d.ledger != ledger:
            await self.kube.patch_job_annotations(namespace, name, {n.ANN_LEDGER: json.dumps(d.ledger, sort_keys=True)})
        self._written[uid] = (new_raw, dict(d.ledger))
        for ev in [*transitions(prev, d.status), *d.events]:
            kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message[:1000])
            log.log(logging.WARNING if ev.type == "Warning" else logging.INFO, "%s/%s: %s %s: %s",
                    namespace, name, ev.type, ev.reason, ev.message)
        self.metrics.job(namespace, name, d.status, body.get("spec"))
