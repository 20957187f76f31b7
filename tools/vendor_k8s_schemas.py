"""Vendor the Kubernetes schemas a GRPOJob embeds (tolerations, resources, affinity, env, volumes,
security contexts) from the official OpenAPI definitions that `kubernetes-validate` ships offline,
as structural schemas a CRD accepts, into runtime/grpojob/api/k8s_schemas.json.

    python -m tools.vendor_k8s_schemas          # or: make k8s-schemas

The runtime never imports kubernetes-validate: it reads the JSON file this writes, and a test
regenerates it from kubernetes-validate so the two never drift.

Conversion (what a CRD's structural schema needs, the same choices controller-gen makes):
- every $ref inlined; `type: [T, "null"]` becomes `type: T` (the API server prunes nulls);
- Quantity and IntOrString become `x-kubernetes-int-or-string`, quantities with the Kubernetes
  quantity grammar as `pattern`;
- `additionalProperties: false` dropped (a structural schema prunes, strict field validation
  refuses unknown fields); free-form objects (FieldsV1) keep `x-kubernetes-preserve-unknown-fields`;
- merge/list-type hints for strategic merge patch dropped (lists in a CR are atomic).
- descriptions kept two levels below each embedded object (`kubectl explain` shows those), each
  cut to its first sentence (plus "Deprecated." where the rest says so; the Kubernetes API
  reference has the whole text): a client-side `kubectl apply` keeps the whole CRD in its 256 KiB
  last-applied-configuration annotation, and the full texts would fill 93% of it
  (docs/real-cluster-rules.md; tests/api/test_crd.py keeps a quarter free).
grpojob's additions, on top of the official schema: resource maps (`requests`, `limits`) accept
only valid resource names (a CEL rule the API server evaluates, acted out in Python by
grpojob.api.k8s) and at most 32 entries (which bounds the rule's cost); tolerations, node selector
requirements and label selector requirements carry the semantic rules of pod validation as CEL
(acted out by grpojob.api.cluster_rules), the affinity lists above them at most 32 items, selector
values the label-value syntax, preferred weights 1-100 (see TOLERATION_RULES and below).
"""
from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runtime" / "grpojob" / "api" / "k8s_schemas.json"

# The Kubernetes release whose definitions are embedded: the one the tests validate rendered
# children against. A field newer than this is refused by the CRD; an older server prunes one
# it does not know.
K8S_VERSION = "1.34.0"
ROOTS = ("Toleration", "ResourceRequirements", "Affinity", "EnvVar", "EnvVarSource", "Volume", "VolumeMount",
         "PodSecurityContext", "SecurityContext")
PREFIX = "io.k8s.api.core.v1."
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# k8s.io/apimachinery/pkg/api/resource: the serialised quantity grammar (as controller-gen emits it).
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
RESOURCE_MAP_MAX = 32
DESCRIPTION_DEPTH = 2
# Resource names a container may request (k8s.io/kubernetes/pkg/apis/core/validation
# validateContainerResourceName): the standard ones, hugepages-<size>, or a domain-prefixed
# extended resource outside kubernetes.io.
RESOURCE_NAME_RULE = ("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-') || "
                      "(k.contains('/') && !k.startsWith('kubernetes.io/') && !k.startsWith('requests.') && "
                      "k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
                      "([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$')))")
RESOURCE_NAME_MESSAGE = ("resource names are cpu, memory, ephemeral-storage, hugepages-<size>, or a "
                         "domain-prefixed extended resource such as nvidia.com/gpu")
_DROP = {"x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type",
         "x-kubernetes-patch-merge-key", "x-kubernetes-patch-strategy", "x-kubernetes-unions",
         "additionalProperties", "$schema", "$id"}


def definitions(version: str = K8S_VERSION) -> dict[str, Any]:
    import kubernetes_validate  # dev-only: the runtime reads the vendored file instead

    path = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
            / "_definitions.json")
    return json.loads(path.read_text())["$defs"]


def _type(t: Any) -> Any:
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        return rest[0] if len(rest) == 1 else rest
    return t


def structural(node: dict[str, Any], defs: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """One official JSON schema node as a structural CRD schema node."""
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        if name in seen:
            raise ValueError(f"recursive definition {' -> '.join(seen + (name,))} cannot be inlined")
        local = {k: v for k, v in node.items() if k != "$ref"}
        if name == QUANTITY:
            return {**local, "x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}
        if name == INT_OR_STRING:
            return {**local, "x-kubernetes-int-or-string": True}
        target = structural(defs[name], defs, seen + (name,))
        return {**target, **{k: v for k, v in local.items() if k == "description"}}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "type":
            out[key] = _type(value)
        elif key == "properties":
            out[key] = {k: structural(v, defs, seen) for k, v in value.items()}
        elif key == "items":
            out[key] = structural(value, defs, seen)
        else:
            out[key] = value
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):  # a map: its values' schema
        out["additionalProperties"] = structural(extra, defs, seen)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True  # free-form in Kubernetes too (FieldsV1)
    if set(out) - {"description"} == set() or "oneOf" in out or "anyOf" in out:
        raise ValueError(f"no structural form for {node}")
    return out


_SENTENCE = re.compile(r"^(.+?[.!?])(?=\s+[A-Z\"'`(\[]|\s*$)", re.S)
_MORE_INFO = re.compile(r"\s*More info:\s*\S+")


def summary(text: str) -> str:
    """A description's first sentence, without its "More info: URL"."""
    text = _MORE_INFO.sub("", text).strip()
    m = _SENTENCE.match(text)
    first = m.group(1) if m else text
    if "deprecated" in text[len(first):].lower() and "deprecated" not in first.lower():
        first += " Deprecated."
    return first


def trim_descriptions(node: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    out = {}
    for key, value in node.items():
        if key == "description" and depth > DESCRIPTION_DEPTH:
            continue
        if key == "description":
            out[key] = summary(value)
        elif key == "properties":
            out[key] = {k: trim_descriptions(v, depth + 1) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = trim_descriptions(value, depth)
        else:
            out[key] = value
    return out


def _resource_maps(schema: dict[str, Any]) -> None:
    # No CEL rule for requests <= limits (ValidateContainerResourceRequirements; grpojob.api.cluster_rules
    # acts it out): a quantity map's values are int-or-string, so a rule must compare
    # quantity(string(self.requests[k])) with the limit's, and the API server costs quantity() of a
    # converted value, whose size it cannot bound, as unbounded: the CRD would be refused (measured
    # with tests/helpers/cel_cost.py: 2^64-1 with or without maxLength on the values).
    for key in ("requests", "limits"):
        m = schema["properties"][key]
        m["maxProperties"] = RESOURCE_MAP_MAX
        m["x-kubernetes-validations"] = [{"rule": RESOURCE_NAME_RULE, "message": RESOURCE_NAME_MESSAGE}]


# The semantic rules of pod validation that the API server applies to a pod but not to a custom
# resource, as CEL on the embedded schemas, so `kubectl apply` of a GRPOJob fails where its pods
# would (grpojob.api.cluster_rules acts out each rule in Python, with the exact field path). A
# required field that is missing is the schema's error: each rule first asks has().
# kubernetes/kubernetes pkg/apis/core/validation/validation.go ValidateTolerations:
TOLERATION_RULES = [
    {"rule": "(!has(self.operator) || self.operator in ['', 'Equal', 'Exists']) && (!has(self.effect) || "
             "self.effect in ['', 'NoSchedule', 'PreferNoSchedule', 'NoExecute'])",
     "message": "operator must be Equal or Exists, effect NoSchedule, PreferNoSchedule or NoExecute"},
    {"rule": "((has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')) && "
             "(!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == '') && "
             "(!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute'))",
     "message": "an empty key needs operator Exists, Exists takes no value, tolerationSeconds needs effect NoExecute"},
]
_VALUES_GIVEN = "has(self.values) && size(self.values) > 0"
_NO_VALUES = "(!has(self.values) || size(self.values) == 0)"
# apimachinery pkg/apis/meta/v1/validation ValidateLabelSelectorRequirement (one rule: the CRD must
# stay small enough for a client-side kubectl apply, tests/api/test_crd.py):
LABEL_SELECTOR_RULES = [
    {"rule": f"!has(self.operator) || (self.operator in ['In', 'NotIn'] ? {_VALUES_GIVEN} : "
             f"self.operator in ['Exists', 'DoesNotExist'] && {_NO_VALUES})",
     "message": "operator In, NotIn: values; Exists, DoesNotExist: none"},
]
# validation.go ValidateNodeSelectorRequirement, and apimachinery pkg/labels/selector.go NewRequirement
# (how the scheduler reads Gt and Lt: one value, an integer):
NODE_SELECTOR_RULES = [
    {"rule": f"!has(self.operator) || (self.operator in ['In', 'NotIn'] ? {_VALUES_GIVEN} : "
             f"self.operator in ['Exists', 'DoesNotExist'] ? {_NO_VALUES} : self.operator in ['Gt', 'Lt'] && "
             "has(self.values) && size(self.values) == 1 && self.values[0].matches('^[+-]?[0-9]+$'))",
     "message": "operator In, NotIn: values; Exists, DoesNotExist: none; Gt, Lt: one integer"},
]
# validation.go ValidateNodeFieldSelectorRequirement (the key: an enum, metadata.name only):
NODE_FIELD_SELECTOR_RULES = [
    {"rule": "!has(self.operator) || (self.operator in ['In', 'NotIn'] && has(self.values) && size(self.values) == 1)",
     "message": "a node field selector takes operator In or NotIn and exactly one value"},
]
# The lists above these rules get a bound (Kubernetes has none): the API server costs a rule under an
# unbounded list as if the list filled a request (docs/real-cluster-rules.md).
SELECTOR_LIST_MAX = 32
LABEL_VALUE_MAX = 63  # apimachinery validation.go LabelValueMaxLength
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _bounded(lst: dict[str, Any]) -> dict[str, Any]:
    lst["maxItems"] = SELECTOR_LIST_MAX
    return lst["items"]


def _requirements(selector: dict[str, Any], key: str, rules: list[dict[str, str]]) -> None:
    item = _bounded(selector["properties"][key])
    item["x-kubernetes-validations"] = copy.deepcopy(rules)
    item["properties"]["values"]["items"].update({"maxLength": LABEL_VALUE_MAX, "pattern": LABEL_VALUE_PATTERN})


def _node_term(term: dict[str, Any]) -> None:
    _requirements(term, "matchExpressions", NODE_SELECTOR_RULES)
    fields = _bounded(term["properties"]["matchFields"])
    fields["x-kubernetes-validations"] = copy.deepcopy(NODE_FIELD_SELECTOR_RULES)
    fields["properties"]["key"]["enum"] = ["metadata.name"]


def _pod_term(term: dict[str, Any]) -> None:
    for selector in ("labelSelector", "namespaceSelector"):
        _requirements(term["properties"][selector], "matchExpressions", LABEL_SELECTOR_RULES)
    term["properties"]["topologyKey"]["minLength"] = 1  # validatePodAffinityTerm: required


def _weighted(lst: dict[str, Any]) -> dict[str, Any]:
    item = _bounded(lst)
    item["properties"]["weight"].update({"minimum": 1, "maximum": 100})  # "must be in the range 1-100"
    return item


def _affinity_rules(affinity: dict[str, Any]) -> None:
    node = affinity["properties"]["nodeAffinity"]["properties"]
    _node_term(_bounded(node[_REQUIRED]["properties"]["nodeSelectorTerms"]))
    _node_term(_weighted(node[_PREFERRED])["properties"]["preference"])
    for kind in ("podAffinity", "podAntiAffinity"):
        pod = affinity["properties"][kind]["properties"]
        _pod_term(_bounded(pod[_REQUIRED]))
        _pod_term(_weighted(pod[_PREFERRED])["properties"]["podAffinityTerm"])


def build(version: str = K8S_VERSION) -> dict[str, Any]:
    import kubernetes_validate

    defs = definitions(version)
    out = {name: trim_descriptions(structural(defs[PREFIX + name], defs, (PREFIX + name,))) for name in ROOTS}
    _resource_maps(out["ResourceRequirements"])
    out["Toleration"]["x-kubernetes-validations"] = copy.deepcopy(TOLERATION_RULES)
    _affinity_rules(out["Affinity"])
    return {"kubernetesVersion": version,
            "source": f"kubernetes-validate {kubernetes_validate.__version__}",
            "generator": "tools/vendor_k8s_schemas.py",
            "definitions": out}


def text(version: str = K8S_VERSION) -> str:
    return json.dumps(build(version), indent=1, sort_keys=True) + "\n"


def main() -> int:
    OUT.write_text(text())
    print(f"wrote {OUT.relative_to(ROOT)} (Kubernetes {K8S_VERSION}, {OUT.stat().st_size // 1024} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
