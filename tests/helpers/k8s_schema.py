"""Validation of Kubernetes objects without an API server.

- Built-in kinds: kubernetes-validate against the official schemas, strict (unknown fields fail).
- GRPOJob objects: JSON-schema validation against our CRD's openAPIV3Schema, with unknown fields
  rejected as `kubectl apply` (field validation Strict) would, and the schema's CEL rules
  (x-kubernetes-validations) evaluated with a real CEL engine (cel-python): this acts out the API
  server's CRD validation, which kmock does not do.
"""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import celpy
import jsonschema
import kubernetes_validate
import yaml

from grpojob.api import k8s

ROOT = Path(__file__).resolve().parents[2]
# The release whose schemas the CRD embeds (tools/vendor_k8s_schemas.py); kubernetes-validate
# ships 1.25-1.37.
K8S_VERSION = k8s.kubernetes_version()


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


_CEL = celpy.Environment()


@lru_cache(maxsize=None)
def _program(rule: str) -> Any:
    return _CEL.program(_CEL.compile(rule))


def _cel(validator: Any, rules: list[dict[str, Any]], instance: Any, schema: dict[str, Any]) -> Any:
    """The API server's CEL validation, acted out: `self` is the value the rule sits on."""
    for rule in rules:
        result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(instance)})
        if not isinstance(result, celpy.celtypes.BoolType) or not result:
            yield jsonschema.ValidationError(rule.get("message") or rule["rule"])


# OpenAPI 3.0 schemas follow JSON Schema draft 4 (boolean exclusiveMinimum and all).
CRDValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-validations": _cel})


def crd_schema(crd_path: Path = ROOT / "crds" / "grpojob.yaml") -> dict[str, Any]:
    crd = yaml.safe_load(crd_path.read_text())
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return k8s.strict(schema)


def validate_grpojob(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
    """Raise jsonschema.ValidationError when the object would be refused by the API server (which
    prunes null fields first)."""
    jsonschema.validate(k8s.prune_nulls(obj), schema or crd_schema(), cls=CRDValidator)


def crd_errors(obj: dict[str, Any], schema: dict[str, Any] | None = None) -> list[str]:
    """Every field path the API server would refuse, as `spec.a.b[0].c` (map keys in brackets)."""
    out = []
    schema = schema or crd_schema()
    for e in CRDValidator(schema).iter_errors(k8s.prune_nulls(obj)):
        path = k8s.subpath(schema, e.absolute_path).lstrip(".")
        if e.validator == "additionalProperties":
            out += [f"{path}.{k}" for k in sorted(set(e.instance) - set(e.schema.get("properties") or {}))]
        elif e.validator == "required":
            out += [f"{path}.{k}" for k in e.validator_value if k not in e.instance]
        else:
            out.append(path)
    return sorted(set(out))
