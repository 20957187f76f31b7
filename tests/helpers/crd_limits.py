"""Two limits a real API server puts on a CRD that kmock does not (docs/real-cluster-rules.md):

1. The CEL cost budget. When a CRD is created or updated, kube-apiserver estimates every
   `x-kubernetes-validations` rule's worst-case cost (tests/helpers/cel_cost.py) times the number
   of times it can run in one object, and refuses a rule above StaticEstimatedCostLimit (10^7) and
   a schema whose rules total above StaticEstimatedCRDCostLimit (10^8). Our own implementation,
   written from reading kubernetes/apiextensions-apiserver (v1.36):
   - pkg/apis/apiextensions/validation/validation.go: the two limits, getExpressionCost (cost x
     cardinality), getCostErrorMessage;
   - pkg/apis/apiextensions/validation/cel_validation.go: a rule's cardinality is the product of
     the maxItems / maxProperties of the lists and maps above it (extractMaxElements); with one of
     them unbounded, pkg/apiserver/schema/cel/compilation.go maxCardinality takes the number of
     copies of the rule's value that fit in a 3 MiB request: MaxRequestSizeBytes / (its minimal
     JSON size + 1);
   - kubernetes/apiserver pkg/cel/common/schemas.go SchemaDeclType: a schema's CEL type and
     bounds (a string's maxLength x 4 bytes, else the request size; a list's maxItems, else as many
     minimal items as a request holds; an object's minimal size from its required fields) and
     pkg/cel/types.go, limits.go, pkg/apis/cel/config.go for the constants.
2. The last-applied-configuration annotation of a client-side `kubectl apply`: the whole object
   as JSON, and an object's annotations may total 256 KiB (kubernetes/apimachinery
   pkg/api/validation/objectmeta.go, TotalAnnotationSizeLimitB: the sum of len(key) + len(value)).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .cel_cost import U64, Decl, mul, rule_cost

MAX_REQUEST = 3 * 1024 * 1024  # apiserver pkg/apis/cel/config.go MaxRequestSizeBytes
PER_RULE_LIMIT = 10_000_000  # validation.go StaticEstimatedCostLimit
CRD_LIMIT = 100_000_000  # validation.go StaticEstimatedCRDCostLimit
STRING_KEY = Decl("string", 0, 2)  # a map's key type: apiservercel.StringType, no MaxElements
NAME_MAX = 253  # the root's metadata.name (model.WithTypeAndObjectMeta caps it)

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_LIMIT = 256 * 1024


def _string(s: dict[str, Any], request: int) -> Decl:
    fmt, max_len = s.get("format"), s.get("maxLength")
    if fmt == "byte":
        return Decl("bytes", max(max_len, 0) if max_len is not None else request - 2, 2)
    if fmt in ("duration", "date", "date-time"):  # limits.go: their longest and shortest JSON forms
        return {"duration": Decl("duration", 32, 3), "date": Decl("timestamp", 12, 12),
                "date-time": Decl("timestamp", 32, 21)}[fmt]
    if max_len is not None:
        return Decl("string", max(max_len, 0) * 4, 2)  # maxLength counts runes, up to 4 bytes each
    if s.get("enum"):
        return Decl("string", max(len(v) for v in s["enum"] if isinstance(v, str)), 2)
    return Decl("string", request - 2, 2)


def _with_object_meta(s: dict[str, Any]) -> dict[str, Any]:
    """A resource root: kind, apiVersion, metadata.name and .generateName always exist."""
    meta = (s.get("properties") or {}).get("metadata", {}).get("properties") or {}

    def capped(prop: dict[str, Any], cap: int) -> dict[str, Any]:
        return {"type": "string", "maxLength": min(prop.get("maxLength", cap), cap)}
    props = dict(s.get("properties") or {})
    props.update(kind={"type": "string"}, apiVersion={"type": "string"},
                 metadata={"type": "object", "properties": {"name": capped(meta.get("name", {}), NAME_MAX),
                                                            "generateName": capped(meta.get("generateName", {}),
                                                                                   NAME_MAX - 1)}})
    return {**s, "properties": props}


def decl_of(s: dict[str, Any], root: bool = False, request: int = MAX_REQUEST) -> Optional[Decl]:
    """common.SchemaDeclType: the CEL type of a structural schema, with its bounds (where none is
    declared: what fits in a request of `request` bytes); None where CEL does not see the value."""
    if s.get("x-kubernetes-int-or-string"):
        max_len = s.get("maxLength")
        return Decl("dyn", max_len * 4 if max_len is not None else request - 2, 1)
    if root:
        s = _with_object_meta(s)
    kind = s.get("type")
    if kind == "array":
        items = s.get("items")
        elem = decl_of(items, bool(items.get("x-kubernetes-embedded-resource")), request) if items else None
        if elem is None:
            return None
        n = s["maxItems"] if "maxItems" in s else (request - 2) // (elem.min_size + 1)
        return Decl("list", max(n, 0), 2, elem=elem)
    if kind == "object":
        extra = s.get("additionalProperties")
        if isinstance(extra, dict):
            elem = decl_of(extra, bool(extra.get("x-kubernetes-embedded-resource")), request)
            if elem is None:
                return None
            n = s["maxProperties"] if "maxProperties" in s else (request - 2) // (elem.min_size + 6)
            return Decl("map", max(n, 0), 2, elem=elem, key=STRING_KEY)
        fields, min_size, required = {}, 2, set(s.get("required") or ())
        for name, prop in (s.get("properties") or {}).items():
            f = decl_of(prop, bool(prop.get("x-kubernetes-embedded-resource")), request)
            if f is None:
                continue
            fields[name] = f  # names CEL would escape (a-b, a.b) are not reached by our rules
            if name in required and "default" not in prop:
                min_size += len(name) + f.min_size + 4
        return Decl("object", 0, min_size, fields=fields)
    if kind == "string":
        return _string(s, request)
    return {"boolean": Decl("bool", 0, 4), "number": Decl("double", 0, 1),
            "integer": Decl("int", 0, 1)}.get(kind)


@dataclass
class RuleCost:
    path: str  # as the API server names the field in its error
    rule: str
    max_cost: int  # one evaluation (cel.EstimateCost's Max)
    cardinality: int  # evaluations in one object, at most
    bounded: bool  # the cardinality comes from declared maxItems/maxProperties, not the request size

    @property
    def cost(self) -> int:
        return 0 if self.max_cost == 0 else mul(self.max_cost, self.cardinality)


def _max_elements(s: dict[str, Any]) -> Optional[int]:
    """extractMaxElements: how many times each child can occur per occurrence of `s` (None: unbounded)."""
    if s.get("type") == "object" and "additionalProperties" in s:
        return s.get("maxProperties")
    if s.get("type") == "array":
        return s.get("maxItems")
    return 1


def rule_costs(schema: dict[str, Any], prefix: str = "spec.validation.openAPIV3Schema",
               request: int = MAX_REQUEST) -> list[RuleCost]:
    """Every rule (and messageExpression) of a CRD's openAPIV3Schema with its estimated cost; with
    another `request` size, what the costs would be if the server allowed larger requests."""
    return list(_walk(schema, prefix, 1, True, request))


def _walk(s: dict[str, Any], path: str, cardinality: Optional[int], root: bool, request: int) -> Iterator[RuleCost]:
    rules = s.get("x-kubernetes-validations") or []
    if rules:
        decl = decl_of(s, root or bool(s.get("x-kubernetes-embedded-resource")), request)
        n = cardinality if cardinality is not None else request // (decl.min_size + 1)
        for i, r in enumerate(rules):
            yield RuleCost(f"{path}.x-kubernetes-validations[{i}].rule", r["rule"], rule_cost(r["rule"], decl), n,
                           cardinality is not None)
            if r.get("messageExpression"):  # costed once, not per occurrence
                yield RuleCost(f"{path}.x-kubernetes-validations[{i}].messageExpression", r["messageExpression"],
                               rule_cost(r["messageExpression"], decl), 1, True)
    per = _max_elements(s)
    inner = None if cardinality is None or per is None else min(cardinality * per, U64)
    for name, prop in (s.get("properties") or {}).items():
        yield from _walk(prop, f"{path}.properties[{name}]", inner, False, request)
    for key in ("items", "additionalProperties"):
        if isinstance(s.get(key), dict):
            yield from _walk(s[key], f"{path}.{key}", inner, False, request)


def total(costs: list[RuleCost]) -> int:
    out = 0
    for c in costs:
        out = min(out + c.cost, U64)
    return out


def cost_error(what: str, cost: int, limit: int) -> str:
    """validation.go getCostErrorMessage, word for word."""
    f = cost / limit
    shown = "more than 100x" if f > 100 else f"{f:f}x" if f < 1.5 else f"{f:.1f}x"
    return (f"{what} exceeds budget by factor of {shown} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")


def refusals(costs: list[RuleCost]) -> list[str]:
    """The cost errors the API server would answer the CRD with (none: it is accepted)."""
    out = [f"{c.path}: Forbidden: " + cost_error("estimated rule cost", c.cost, PER_RULE_LIMIT)
           for c in costs if c.cost > PER_RULE_LIMIT]
    if total(costs) > CRD_LIMIT:
        out.append(cost_error("x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                              total(costs), CRD_LIMIT))
    return out


def last_applied_bytes(obj: dict[str, Any]) -> int:
    """What a client-side `kubectl apply` of `obj` adds to its annotations' total: the key plus the
    object as Go's encoding/json encoder writes it (compact, UTF-8, `<`, `>`, `&`, U+2028 and U+2029
    escaped as six-byte \\uXXXX, a trailing newline)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    escaped = sum(text.count(c) for c in "<>&\u2028\u2029")
    return len(LAST_APPLIED) + len(text.encode()) + 5 * escaped + 1
