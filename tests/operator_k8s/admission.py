"""Admission plugins of a real API server, acted out as emulator hooks (kmock enforces none):

- OwnerReferencesPermissionEnforcement (on by default in OpenShift): a request that sets
  `blockOwnerDeletion` on an owner reference needs `update` on the owner's `finalizers`
  subresource, and an update that changes an object's owner references needs `delete` on that
  object. The operator's permissions are exactly `RBAC_RULES` (the chart's Role is tested equal).
- PodSecurity: in a namespace labelled `pod-security.kubernetes.io/enforce=<level>`, a pod that
  breaks the level is refused (tests/helpers/pod_security.py has the checks).
- StatefulSet validation: an update may change only replicas, ordinals, template, updateStrategy,
  revisionHistoryLimit, persistentVolumeClaimRetentionPolicy and minReadySeconds of its spec
  (ValidateStatefulSetUpdate in k8s.io/kubernetes pkg/apis/apps/validation/validation.go); the
  volumeClaimTemplates among the rest.

Requests of the test's own client (kmock's, standing for the cluster's controllers and users) are
not the operator's and pass; everything else comes from the operator's service account.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import kmock
from kmock._internal import dicts, enums, rendering

from grpojob.api import GROUP, KIND, PLURAL
from grpojob_operator import rbac
from tests.helpers import pod_security

from .kmock_shim import PODS, STATEFULSETS, Emulator

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# Owner kinds the acted-out REST mapper knows: kind -> (group, plural).
OWNER_RESOURCES = {KIND: (GROUP, PLURAL), "StatefulSet": ("apps", "statefulsets"),
                   "Deployment": ("apps", "deployments"), "ReplicaSet": ("apps", "replicasets")}


def _from_operator(request: rendering.Request) -> bool:
    return not request.headers.get("User-Agent", "").startswith("kmock/")


def _refs(obj: Any) -> list[dict[str, Any]]:
    return ((obj or {}).get("metadata") or {}).get("ownerReferences") or []


def _blocking(refs: list[dict[str, Any]]) -> set[str]:
    return {r.get("uid", "") for r in refs if r.get("blockOwnerDeletion")}


def owner_references_permission_enforcement(emulator: Emulator,
                                            allows: Callable[[str, str, str], bool] = rbac.allows) -> None:
    """Acts out OwnerReferencesPermissionEnforcement for the operator's requests."""

    async def hook(request: rendering.Request) -> None:
        if not _from_operator(request) or request.action not in (enums.action.CREATE, enums.action.UPDATE) \
                or request.subresource or not isinstance(request.data, dict):
            return
        res = request.resource
        name = request.name or (request.data.get("metadata") or {}).get("name")
        old = None
        if request.action == enums.action.UPDATE:
            old = emulator.get_obj(res, request.namespace, request.name)
            if "ownerReferences" not in (request.data.get("metadata") or {}):
                return  # a merge patch without owner references keeps them
        new_refs, old_refs = _refs(request.data), _refs(old)
        if request.action == enums.action.UPDATE and new_refs != old_refs and \
                not allows(res.group, res.plural, "delete"):
            raise kmock.KubernetesError(403, "Forbidden", f'{res.plural} "{name}" is forbidden: cannot set an '
                                        "ownerRef on a resource you can't delete")
        for ref in new_refs:
            if ref.get("uid", "") in _blocking(new_refs) - _blocking(old_refs):
                group, plural = OWNER_RESOURCES[ref["kind"]]
                if not allows(group, f"{plural}/finalizers", "update"):
                    raise kmock.KubernetesError(
                        403, "Forbidden", f'{res.plural} "{name}" is forbidden: cannot set blockOwnerDeletion if an '
                        f"ownerReference refers to a resource you can't set finalizers on: User "
                        f'"system:serviceaccount:grpojob-system:grpojob" cannot update resource "{plural}/finalizers" '
                        f'in API group "{group}"')
    emulator.hooks.append(hook)


def pod_security_admission(emulator: Emulator) -> None:
    """Acts out PodSecurity admission (enforce mode) for pods created in labelled namespaces."""

    async def hook(request: rendering.Request) -> None:
        if request.resource != PODS or request.action != enums.action.CREATE:
            return
        ns = next((o for o in emulator.live(kmock.resource("", "v1", "namespaces"))
                   if o["metadata"]["name"] == request.namespace), None)
        level = ((ns or {}).get("metadata", {}).get("labels") or {}).get(ENFORCE_LABEL)
        if level not in ("baseline", "restricted"):
            return
        check = pod_security.restricted if level == "restricted" else pod_security.baseline
        violations = check(copy.deepcopy(request.data.get("spec") or {}))
        if violations:
            name = (request.data.get("metadata") or {}).get("name", "")
            raise kmock.KubernetesError(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity '
                                        f'"{level}:latest": ' + ", ".join(violations))
    emulator.hooks.append(hook)


STATEFULSET_MUTABLE = ("replicas", "ordinals", "template", "updateStrategy", "revisionHistoryLimit",
                       "persistentVolumeClaimRetentionPolicy", "minReadySeconds")


def statefulset_update_validation(emulator: Emulator) -> None:
    """Acts out the API server's refusal of a StatefulSet update that changes a fixed spec field."""

    async def hook(request: rendering.Request) -> None:
        if request.resource != STATEFULSETS or request.action != enums.action.UPDATE or request.subresource \
                or not isinstance(request.data, dict) or "spec" not in request.data:
            return
        old = emulator.get_obj(STATEFULSETS, request.namespace, request.name)
        if old is None:
            return
        new = dicts.patch_dict(copy.deepcopy(old), {"spec": request.data["spec"]})  # a JSON merge patch
        fixed = [k for k in sorted(set(old["spec"]) | set(new["spec"]))
                 if k not in STATEFULSET_MUTABLE and old["spec"].get(k) != new["spec"].get(k)]
        if fixed:
            raise kmock.KubernetesError(
                422, "Invalid", f'StatefulSet.apps "{request.name}" is invalid: spec: Forbidden: updates to '
                "statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
                "'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are "
                f"forbidden (changed: {', '.join(fixed)})")
    emulator.hooks.append(hook)
