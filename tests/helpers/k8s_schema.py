"""Validation of Kubernetes objects without an API server.

- Built-in kinds: kubernetes-validate against the official schemas, strict (unknown fields fail).
- GRPOJob objects: JSON-schema validation against our CRD's openAPIV3Schema, with unknown fields
  rejected as `kubectl apply` (field validation Strict) would.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.34.0"  # a current Kubernetes; the validator ships 1.25-1.37


def validate_builtin(obj: dict[str, Any], version: str = K8S_VERSION) -> None:
    """Raise kubernetes_validate.ValidationError (or SchemaNotFoundError) for a bad object."""
    kubernetes_validate.validate(obj, version, strict=True)


def validate_all(objs: Iterable[dict[str, Any]], version: str = K8S_VERSION) -> int:
    n = 0
    for obj in objs:
        if obj is None:
            continue
        if obj.get("apiVersion", "").startswith(("monitoring.coreos.com", "scheduling.volcano.sh")):
            continue  # third-party CRDs: not in the official schemas
        if obj.get("kind") == "GRPOJob":
            validate_grpojob(obj)
        else:
            validate_builtin(obj, version)
        n += 1
    return n


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        if out.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def crd_schema(crd_path: Path = ROOT / "crds" / "grpojob.yaml") -> dict[str, Any]:
    crd = yaml.safe_load(crd_path.read_text())
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return _strict(schema)


def validate_grpojob(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise jsonschema.ValidationError when the object would be refused by the API server."""
    # OpenAPI 3.0 schemas follow JSON Schema draft 4 (boolean exclusiveMinimum and all).
    jsonschema.validate(obj, schema or crd_schema(), cls=jsonschema.Draft4Validator)
