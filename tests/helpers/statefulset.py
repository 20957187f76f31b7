"""The StatefulSet controller's rules for a pod's claims, acted out (no controller runs here):

- each of `spec.volumeClaimTemplates` becomes one PersistentVolumeClaim per pod, named
  `<template>-<statefulset>-<ordinal>`, and pod `<ordinal>` mounts it as a volume named after the
  template (https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#stable-storage);
- `spec.persistentVolumeClaimRetentionPolicy`: with whenScaled Retain a claim outlives its pod
  when the StatefulSet scales down; with whenDeleted Delete the controller makes the StatefulSet
  the claim's owner, so the garbage collector deletes the claim with the StatefulSet
  (https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#persistentvolumeclaim-retention).
"""
from __future__ import annotations

import copy
from typing import Any


def claim_name(sts: dict[str, Any], template: str, ordinal: int) -> str:
    return f"{template}-{sts['metadata']['name']}-{ordinal}"


def pod_spec(sts: dict[str, Any], ordinal: int) -> dict[str, Any]:
    """Pod `ordinal`'s spec: the template's, plus a volume for each claim template."""
    spec = copy.deepcopy(sts["spec"]["template"]["spec"])
    for t in sts["spec"].get("volumeClaimTemplates") or []:
        name = t["metadata"]["name"]
        spec.setdefault("volumes", []).append(
            {"name": name, "persistentVolumeClaim": {"claimName": claim_name(sts, name, ordinal)}})
    return spec


def claims(sts: dict[str, Any], ordinal: int) -> list[dict[str, Any]]:
    """The claims pod `ordinal` needs, as the controller creates them (owned by the StatefulSet
    when its retention policy says whenDeleted: Delete)."""
    meta = sts["metadata"]
    owned = (sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted") == "Delete"
    out = []
    for t in sts["spec"].get("volumeClaimTemplates") or []:
        claim_meta: dict[str, Any] = {"name": claim_name(sts, t["metadata"]["name"], ordinal),
                                      "namespace": meta["namespace"],
                                      "labels": dict(t["metadata"].get("labels") or {})}
        if owned:
            claim_meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                              "uid": meta.get("uid", ""), "controller": True}]
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": claim_meta,
                    "spec": copy.deepcopy(t["spec"])})
    return out
