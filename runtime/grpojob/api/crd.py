"""Generate the GRPOJob CustomResourceDefinition from the pydantic models.

Pydantic's JSON schema is close to a Kubernetes structural schema; the differences handled here:
$refs are inlined, Optional's null branch is dropped, int|str becomes x-kubernetes-int-or-string,
free-form dicts keep unknown fields, and titles / null defaults go. Kubernetes sub-objects
(grpojob.api.k8s) become their official schemas, vendored in k8s_schemas.json.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml

from grpojob.api import k8s
from grpojob.api import spec as s
from grpojob.api.spec import GRPOJobSpec
from grpojob.api.status import GRPOJobStatus

_DROP = {"title", "discriminator"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if k8s.MARKER in node:  # a Kubernetes core/v1 object: its official schema
        target = k8s.schema(node[k8s.MARKER])
        if node.get("description"):
            target["description"] = node["description"]
        return target
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        # A description on the referring field wins over the model's docstring.
        target.update({k: v for k, v in node.items() if k != "$ref"})
        return _structural(target, defs)
    for key in ("anyOf", "oneOf"):
        if key in node:
            branches = [b for b in node[key] if b.get("type") != "null"]
            rest = {k: v for k, v in node.items() if k != key}
            if rest.get("default", 0) is None:
                rest.pop("default")
            types = sorted(b.get("type", "") for b in branches)
            if types == ["integer", "string"]:
                rest["x-kubernetes-int-or-string"] = True
                return _structural(rest, defs)
            if len(branches) != 1:
                raise ValueError(f"cannot express union {node} in a structural schema")
            return _structural({**branches[0], **rest}, defs)
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in _DROP or (k == "default" and v is None):
            continue
        if k == "properties":
            out[k] = {name: _structural(p, defs) for name, p in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = _structural(v, defs)
        elif k == "const":
            out["enum"] = [v]
        elif k in ("exclusiveMinimum", "exclusiveMaximum"):  # JSON Schema number -> OpenAPI 3.0 bool
            out["minimum" if k == "exclusiveMinimum" else "maximum"] = v
            out[k] = True
        elif k == "additionalProperties" and v is False:
            continue  # structural schemas reject unknown fields by pruning; the API already forbids them
        elif k.startswith("x-kubernetes-"):  # Kubernetes' own keywords (CEL rules, list types): verbatim
            out[k] = copy.deepcopy(v)
        else:
            out[k] = _structural(v, defs)
    if out.get("type") == "object" and "properties" not in out:
        extra = out.get("additionalProperties")
        if not extra or extra == {} or extra is True:
            out.pop("additionalProperties", None)
            out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") is None and not out.get("x-kubernetes-int-or-string") and "properties" not in out:
        out["type"] = "object"
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def schema_of(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def openapi_schema() -> dict[str, Any]:
    spec = schema_of(GRPOJobSpec)
    status = schema_of(GRPOJobStatus)
    return {
        "type": "object",
        "description": "A GRPO reinforcement-learning run: trainer pods (torchrun) and rollout servers "
                       "(vLLM) working on one policy.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: grpojob.io/v1alpha1."},
            "kind": {"type": "string", "description": "Kind: GRPOJob."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{s.PLURAL}.{s.GROUP}"},
        "spec": {
            "group": s.GROUP,
            "scope": "Namespaced",
            "names": {"kind": s.KIND, "listKind": f"{s.KIND}List", "plural": s.PLURAL,
                      "singular": s.SINGULAR, "shortNames": s.SHORT_NAMES, "categories": ["all", "ml"]},
            "versions": [{
                "name": s.VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": openapi_schema()},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
                    {"name": "Total", "type": "integer", "jsonPath": ".status.progress.totalSteps",
                     "priority": 1},
                    {"name": "Reward", "type": "number", "jsonPath": ".status.progress.rewardMean"},
                    # The last evaluation's mean reward on the held-out set (spec.evaluation).
                    {"name": "Eval", "type": "number", "jsonPath": ".status.progress.evaluation.rewardMean",
                     "priority": 1},
                    {"name": "Policy", "type": "integer", "jsonPath": ".status.progress.policyVersion",
                     "priority": 1},
                    # Policy versions each rollout server is behind, e.g. 0,1,0 (kubectl get grpo -o wide).
                    {"name": "Lag", "type": "string", "jsonPath": ".status.progress.rollouts[*].lag",
                     "priority": 1},
                    {"name": "Sync", "type": "string", "jsonPath": ".status.progress.weightSyncBackend",
                     "priority": 1},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    # What the job waits for or why it failed (the claim that does not bind, the
                    # image that does not pull, a crash's termination message): the operator's words.
                    {"name": "Message", "type": "string", "jsonPath": ".status.message"},
                ],
            }],
        },
    }


def served_versions() -> list[str]:
    """The apiVersions of GRPOJob that this CRD serves (grpojob version prints them)."""
    return [f"{s.GROUP}/{v['name']}" for v in crd()["spec"]["versions"] if v["served"]]


HEADER = "# Generated by `grpojob crd` from runtime/grpojob/api/*.py. Do not edit by hand.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)
