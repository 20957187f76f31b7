"""Kubernetes sub-objects of a GRPOJob (tolerations, resources, affinity, env, volumes, security
contexts): their official schemas, vendored in k8s_schemas.json by tools/vendor_k8s_schemas.py,
embedded into the CRD by crd.py and checked here with jsonschema, so `grpojob validate`, the
operator and the API server refuse the same manifests with the same field paths.

A model field declared `Annotated[dict[str, Any], K8s("Toleration")]` accepts exactly what the
Kubernetes definition accepts (unknown fields refused, as with `kubectl apply`'s strict field
validation), with nulls pruned as the API server prunes them.
"""
from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic_core import PydanticCustomError, core_schema

from grpojob.api.base import deferring
from grpojob.api.cluster_rules import RULES  # the API server's semantic rules, once the schema passes
from grpojob.api.names import PATTERN_WORDS

SCHEMAS_FILE = Path(__file__).with_name("k8s_schemas.json")
MARKER = "x-grpojob-k8s"  # in pydantic's JSON schema: crd.py puts the definition in its place
ERROR_TYPE = "k8s_schema"

_QUANTITY_HINT = "must be a quantity such as 8, 500m or 16Gi"
_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
               "object": "an object", "array": "a list"}


def pattern_message(pattern: str) -> str:
    """What a value that does not match `pattern` should be (a quantity's or a name's pattern, said
    in words)."""
    if "KMGTPE" in pattern:
        return _QUANTITY_HINT
    return PATTERN_WORDS.get(pattern, f"must match {pattern}")


@lru_cache(maxsize=1)
def vendored() -> dict[str, Any]:
    return json.loads(SCHEMAS_FILE.read_text())


def kubernetes_version() -> str:
    return vendored()["kubernetesVersion"]


def schema(name: str) -> dict[str, Any]:
    """The structural schema of a vendored definition (a fresh copy, safe to edit)."""
    return copy.deepcopy(vendored()["definitions"][name])


# -- CEL rules of the vendored schemas, acted out in Python ----------------------------------------
# The API server evaluates `x-kubernetes-validations`; here each rule the vendored schemas carry has
# its Python twin (tests check both agree, evaluating the CEL with a real CEL engine).

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def valid_resource_name(name: str) -> bool:
    """A resource a container may request: standard, hugepages-<size>, or a domain-prefixed extended
    resource outside kubernetes.io (k8s core validation's validateContainerResourceName)."""
    if name in STANDARD_RESOURCES or name.startswith("hugepages-"):
        return True
    domain, slash, rest = name.partition("/")
    return bool(slash) and not name.startswith(("kubernetes.io/", "requests.")) and \
        bool(_DNS_SUBDOMAIN.match(domain)) and bool(_QUALIFIED_NAME.match(rest))


def _resource_names(value: Any) -> list[str]:
    return [k for k in value if not valid_resource_name(k)] if isinstance(value, dict) else []


def rule_checks() -> dict[str, Callable[[Any], list[Any]]]:
    """CEL rule text -> its Python twin, which returns the keys (or [None] for the whole value)
    that break the rule. The resource-name rule is checked here, with the schema; the other rules
    the vendored schemas carry (grpojob's additions: tools/vendor_k8s_schemas.py) are acted out,
    with more precise paths, by grpojob.api.cluster_rules once the schema passes."""
    resource_rules = {v["rule"] for part in ("limits", "requests") for v in
                      vendored()["definitions"]["ResourceRequirements"]["properties"][part]
                      .get("x-kubernetes-validations", ())}
    return {rule: _resource_names for rule in resource_rules}


# -- validation -----------------------------------------------------------------------------------

def strict(node: Any) -> Any:
    """A structural schema as jsonschema reads it: unknown fields refused (kubectl's strict field
    validation), int-or-string as a union."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def _cel(validator: Any, rules: list[dict[str, Any]], instance: Any, schema_: dict[str, Any]) -> Iterator[Any]:
    from jsonschema import ValidationError

    checks = rule_checks()
    for rule in rules:
        if rule["rule"] not in checks:
            continue  # grpojob.api.cluster_rules acts it out
        for key in checks[rule["rule"]](instance):
            yield ValidationError(rule.get("message") or f"failed rule: {rule['rule']}",
                                  path=() if key is None else (key,))


@lru_cache(maxsize=None)
def _validator(name: str) -> Any:
    import jsonschema  # imported on first use: most imports of grpojob.api validate nothing

    # OpenAPI 3.0 schemas follow JSON Schema draft 4; CEL rules go to their Python twins.
    cls = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-validations": _cel})
    return cls(strict(vendored()["definitions"][name]))


def prune_nulls(value: Any) -> Any:
    """What the API server stores: fields set to null are dropped."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def subpath(root: dict[str, Any], path: Any) -> str:
    """`.field` for properties, `[i]` for list items and `[key]` for map keys."""
    out, node = "", root
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node.get("items", {})
        elif part in (node.get("properties") or {}):
            out += f".{part}"
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            out += f"[{part}]"
            node = node["additionalProperties"]
        else:  # a field the schema does not know (reported as unknown)
            out += f".{part}"
            node = {}
    return out


def _messages(err: Any, root: dict[str, Any]) -> Iterator[tuple[str, str]]:
    path, kind, expected = subpath(root, err.absolute_path), err.validator, err.validator_value
    if kind == "additionalProperties":
        known = set(err.schema.get("properties") or {})
        for key in sorted(set(err.instance) - known):
            yield f"{path}.{key}", "unknown field"
    elif kind == "required":
        for key in expected:
            if isinstance(err.instance, dict) and key not in err.instance:
                yield f"{path}.{key}", "required field is missing"
    elif kind == "type":
        yield path, f"must be {_TYPE_NAMES.get(expected, expected)}"
    elif kind == "anyOf":  # x-kubernetes-int-or-string
        yield path, "must be an integer or a string"
    elif kind == "pattern":
        yield path, pattern_message(expected)
    elif kind == "enum":
        yield path, "must be one of " + ", ".join(map(str, expected))
    elif kind == "x-kubernetes-validations":
        yield path, f"not a valid name: {err.message}"
    elif kind == "maxProperties":
        yield path, f"must have at most {expected} entries"
    else:
        yield path, err.message


def errors(name: str, value: Any) -> list[tuple[str, str]]:
    """(sub-path, message) for every way `value` breaks the definition `name`, sorted by path."""
    root = vendored()["definitions"][name]
    found = {m for e in _validator(name).iter_errors(value) for m in _messages(e, root)}
    return sorted(found)


class K8s:
    """Pydantic marker: the value is a `name` object of the Kubernetes core API."""

    def __init__(self, name: str):
        if name not in vendored()["definitions"]:
            raise KeyError(f"{name} is not vendored in {SCHEMAS_FILE.name}: add it to tools/vendor_k8s_schemas.py")
        self.name = name

    def validate(self, value: dict[str, Any], info: Any = None) -> dict[str, Any]:
        value = prune_nulls(value)
        found = errors(self.name, value)
        if not found and self.name in RULES and not deferring(info):
            found = RULES[self.name](value)
        if found:
            summary = "; ".join(f"{p}: {m}" if p else m for p, m in found)
            raise PydanticCustomError(ERROR_TYPE, "{summary}", {"summary": summary, "errors": found})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return core_schema.with_info_after_validator_function(self.validate, core_schema.dict_schema())

    def __get_pydantic_json_schema__(self, core: Any, handler: Any) -> dict[str, Any]:
        return {MARKER: self.name}
