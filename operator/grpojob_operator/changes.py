"""Which spec changes a running job accepts.

Scaling the rollouts (not with scheduling.gang kueue: its pod group's size is in every pod's
template) and their autoscaler's settings, the run policy (suspend, limits, cleanup) and who may reach the pods (the
NetworkPolicies) apply in place; a suspended job takes any edit but its checkpoint storage (FIXED);
anything else
(model, data, algorithm, trainer shape...) would silently restart or corrupt a run, so it is refused
while the job is active and the job keeps running on the spec it was started with. An edit is taken
as a whole: one refused field refuses all of it, so no edit ever half-applies.
"""
from __future__ import annotations

from typing import Any, Optional

from grpojob.api import API_VERSION, KIND, GRPOJob, check

MUTABLE = ("rollout.replicas", "rollout.autoscale", "runPolicy", "network")  # spec paths (camelCase) that may change while running
# Fixed for the job's life, suspended too: they shape the trainer StatefulSet's volumeClaimTemplates,
# which the API server refuses to change (only replicas, template, updateStrategy, ordinals,
# persistentVolumeClaimRetentionPolicy, minReadySeconds and revisionHistoryLimit may).
FIXED = ("checkpoint.volumeClaim", "checkpoint.storage", "checkpoint.size", "checkpoint.storageClassName")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: node}


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == m or path.startswith(m + ".") for m in prefixes)


def _full(job: GRPOJob) -> dict[str, Any]:
    return job.model_dump(by_alias=True, exclude_none=True, mode="json")["spec"]


def immutable_changes(applied: GRPOJob, new: GRPOJob, suspended: bool = False) -> list[str]:
    """One message per refused field, naming its path and both values; the edit's other changes
    are named as held back with it. suspended: only FIXED fields are refused."""
    a, b = _flatten(_full(applied)), _flatten(_full(new))
    out, held = [], []
    for path in sorted(set(a) | set(b)):
        if a.get(path) == b.get(path):
            continue
        if _under(path, FIXED):
            out.append(f"spec.{path} cannot change after the job is created (it has {a.get(path)!r}, asked for "
                       f"{b.get(path)!r}): the trainer StatefulSet's volumeClaimTemplates are immutable; revert it, "
                       "or delete the job and create it anew")
        elif not suspended and path == "rollout.replicas" and applied.spec.scheduling.gang == "kueue":
            out.append(f"spec.rollout.replicas cannot change on a running job with scheduling.gang kueue (running "
                       f"with {a.get(path)!r}, asked for {b.get(path)!r}): its trainer and rollout pods are one Kueue "
                       "pod group whose size is in every pod's template, so a new count is a new gang that restarts "
                       "every pod; suspend the job, change it, resume")
        elif suspended or _under(path, MUTABLE):
            held.append(f"spec.{path}")
        else:
            out.append(f"spec.{path} cannot change on a running job (running with {a.get(path)!r}, "
                       f"asked for {b.get(path)!r}); revert it, or suspend the job first")
    if out and held:
        out.append(f"the rest of the edit ({', '.join(held)}) is not applied either: an edit applies whole or not at all")
    return out


def applied_job(new_doc_meta: dict[str, Any], applied_spec: Optional[dict[str, Any]]) -> Optional[GRPOJob]:
    """The job the children were last built from, or None (no record, or an unreadable one)."""
    if applied_spec is None:
        return None
    job, errors = check({"apiVersion": API_VERSION, "kind": KIND, "metadata": new_doc_meta, "spec": applied_spec},
                        resolve_plugins=False)
    return job if job is not None and not errors else None


def effective(new: Optional[GRPOJob], applied: Optional[GRPOJob], state: str) -> tuple[Optional[GRPOJob], list[str]]:
    """(the job to reconcile, refusal messages).

    state: active (an edit with a refused field is refused whole, with messages), finished (kept as
    it ran, silently), or suspended (everything but the FIXED fields applies on resume)."""
    if new is None or applied is None:
        return new, []
    refused = immutable_changes(applied, new, suspended=state == "suspended")
    if not refused:
        return new, []
    return applied, (refused if state in ("active", "suspended") else [])
