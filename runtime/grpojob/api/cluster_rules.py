"""What the Kubernetes API server (and the scheduler) refuse in the Kubernetes objects a GRPOJob
embeds, beyond their schemas: the semantic rules of pod validation, acted out in Python so that
`grpojob validate`, the operator's InvalidSpec condition and the runtime refuse what a real cluster
would refuse, each error at its field path, all of them at once.

Each rule takes an object that already matches its official schema (grpojob.api.k8s checks that
first) and returns (sub-path, message) pairs. Sources, kubernetes/kubernetes
pkg/apis/core/validation/validation.go unless said otherwise:
- Toleration: `ValidateTolerations`, `validateTaintEffect`;
- ResourceRequirements: `ValidateContainerResourceRequirements` (requests <= limits, equal for
  resources that cannot be overcommitted, a limit for those, integers for extended resources,
  hugepages), `ValidateResourceQuantityValue`, `validateResourceQuantityHugePageValue`;
  pkg/apis/core/helper/helpers.go `IsOvercommitAllowed`, `IsExtendedResourceName`;
- Affinity: `validateAffinity`, `ValidateNodeSelector`, `ValidateNodeSelectorTerm`,
  `ValidateNodeSelectorRequirement`, `ValidateNodeFieldSelectorRequirement`,
  `validatePreferredSchedulingTerms`, `validatePodAffinityTerm`, `validateWeightedPodAffinityTerms`;
  apimachinery pkg/apis/meta/v1/validation `ValidateLabelSelector`,
  `ValidateLabelSelectorRequirement`; and apimachinery pkg/labels/selector.go `NewRequirement`
  (the scheduler's reading of Gt and Lt: one value, an integer);
- Volume: `validateVolumes` (names are DNS-1123 labels); the objects a volume names (Secret,
  ConfigMap, PersistentVolumeClaim) have DNS-1123 subdomain names (generic.go NameIsDNSSubdomain):
  a pod naming another can never start;
- EnvVar: `validateEnv` (RelaxedEnvironmentVariableValidation, GA in 1.34: any printable ASCII but
  '='), `validateSecretKeySelector`, `validateConfigMapKeySelector`.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from grpojob.api import names, quantity
from grpojob.api.names import Problems

TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
LABEL_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_FIELD_SELECTOR_KEYS = ("metadata.name",)  # validation.go nodeFieldSelectorValidators
CPU_MEMORY = ("cpu", "memory")
_INT64 = re.compile(r"^[+-]?[0-9]+$")


def _under(prefix: str, found: Problems) -> Problems:
    return [(prefix + sub, msg) for sub, msg in found]


def toleration(t: dict[str, Any]) -> Problems:
    """ValidateTolerations, for one item."""
    out: Problems = []
    key, op, value, effect = (t.get(k) or "" for k in ("key", "operator", "value", "effect"))
    if key:
        out += [(".key", m) for m in names.qualified_name(key)]
    elif op != "Exists":
        out.append((".operator", "must be Exists when key is empty (which means: match all keys and values)"))
    if "tolerationSeconds" in t and effect != "NoExecute":
        out.append((".effect", f"must be NoExecute when tolerationSeconds is set, not '{effect}'"))
    if op in ("Equal", ""):  # empty means Equal
        out += [(".value", m) for m in names.label_value(value)]
    elif op == "Exists":
        if value:
            out.append((".value", "must be empty when operator is Exists"))
    else:
        out.append((".operator", f"'{op}' is not supported: use {' or '.join(TOLERATION_OPERATORS)}"))
    if effect and effect not in TAINT_EFFECTS:  # empty matches every effect
        out.append((".effect", f"'{effect}' is not supported: use {', '.join(TAINT_EFFECTS)} (or leave it empty)"))
    return out


def _native(name: str) -> bool:
    """helpers.go IsNativeResource: no domain, or a kubernetes.io one."""
    return "/" not in name or "kubernetes.io/" in name


def overcommit_allowed(name: str) -> bool:
    """helpers.go IsOvercommitAllowed: native resources but hugepages (cpu, memory, ephemeral-storage)."""
    return _native(name) and not name.startswith("hugepages-")


def _hugepage_size(name: str) -> Any:
    size = quantity.parse(name.removeprefix("hugepages-")) if name.startswith("hugepages-") else None
    return size if size is not None and size > 0 else None


def resources(r: dict[str, Any]) -> Problems:
    """ValidateContainerResourceRequirements: the quantities compared exactly (1024Mi == 1Gi)."""
    out: Problems = []
    limits, requests = r.get("limits") or {}, r.get("requests") or {}
    for part, values in (("limits", limits), ("requests", requests)):
        for name, raw in values.items():
            q = quantity.parse(raw)
            if q is None:  # not a quantity: the schema's pattern says so
                continue
            where, shown = f".{part}[{name}]", quantity.text(raw)
            if q < 0:
                out.append((where, f"{shown} must be greater than or equal to 0"))
            elif not _native(name) and q.denominator != 1:  # IsExtendedResourceName -> IsIntegerResourceName
                out.append((where, f"{shown}: an extended resource must be a whole number"))
            size = _hugepage_size(name)
            if size is not None and q >= 0 and q % size:
                out.append((where, f"{shown} is not a whole multiple of the page size "
                            f"{name.removeprefix('hugepages-')}"))
    for name, raw in requests.items():
        q, lim = quantity.parse(raw), quantity.parse(limits.get(name))
        where, shown = f".requests[{name}]", quantity.text(raw)
        if q is None or (name in limits and lim is None):
            continue
        if name in limits:
            if not overcommit_allowed(name) and q != lim:
                out.append((where, f"{shown} must be equal to the {name} limit of {quantity.text(limits[name])} "
                            f"({name} cannot be overcommitted)"))
            elif q > lim:
                out.append((where, f"{shown} must be less than or equal to the {name} limit of "
                            f"{quantity.text(limits[name])}"))
        elif not overcommit_allowed(name):
            out.append((f".limits[{name}]", f"required: {name} cannot be overcommitted, so its request of {shown} "
                        "needs a limit (equal to it)"))
    asked = set(limits) | set(requests)
    if any(n.startswith("hugepages-") for n in asked) and not asked & set(CPU_MEMORY):
        out.append(("", "hugepages need a cpu or memory request or limit as well"))
    return out


def _values(values: list[str]) -> Problems:
    return [(f".values[{i}]", m) for i, v in enumerate(values) for m in names.label_value(v)]


def _set_values(op: str, values: list[str]) -> Problems:
    """The set operators' rule, the same in node and label selectors: In and NotIn need values,
    Exists and DoesNotExist take none."""
    if op in ("In", "NotIn") and not values:
        return [(".values", f"required when operator is {op} (at least one value)")]
    if op in ("Exists", "DoesNotExist") and values:
        return [(".values", f"must be empty when operator is {op}")]
    return []


def node_selector_requirement(rq: dict[str, Any]) -> Problems:
    """ValidateNodeSelectorRequirement, and labels.NewRequirement for Gt and Lt."""
    op, values = rq.get("operator", ""), rq.get("values") or []
    out: Problems = _set_values(op, values)
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            out.append((".values", f"must be exactly one value when operator is {op}, not {len(values)}"))
        elif not _INT64.match(values[0]) or not -2 ** 63 <= int(values[0]) < 2 ** 63:
            out.append((".values[0]", f"'{values[0]}' must be an integer when operator is {op} (the scheduler "
                        "compares it as one)"))
    elif op not in ("In", "NotIn", "Exists", "DoesNotExist"):
        out.append((".operator", f"'{op}' is not a valid node selector operator: use "
                    f"{', '.join(NODE_SELECTOR_OPERATORS)}"))
    out += [(".key", m) for m in names.qualified_name(rq.get("key", ""))]
    return out + _values(values)


def node_field_selector_requirement(rq: dict[str, Any]) -> Problems:
    """ValidateNodeFieldSelectorRequirement: metadata.name, In or NotIn, one node name."""
    out: Problems = []
    op, values, key = rq.get("operator", ""), rq.get("values") or [], rq.get("key", "")
    if op not in ("In", "NotIn"):
        out.append((".operator", f"'{op}' is not a valid node field selector operator: use In or NotIn"))
    elif len(values) != 1:
        out.append((".values", f"must be exactly one value when operator is {op} in a node field selector"))
    if key not in NODE_FIELD_SELECTOR_KEYS:
        out.append((".key", f"'{key}' is not a node field selector key: use metadata.name"))
    return out + [(f".values[{i}]", m) for i, v in enumerate(values) for m in names.dns1123_subdomain(v)]


def node_selector_term(term: dict[str, Any]) -> Problems:
    """ValidateNodeSelectorTerm."""
    out: Problems = []
    for i, rq in enumerate(term.get("matchExpressions") or []):
        out += _under(f".matchExpressions[{i}]", node_selector_requirement(rq))
    for i, rq in enumerate(term.get("matchFields") or []):
        out += _under(f".matchFields[{i}]", node_field_selector_requirement(rq))
    return out


def label_selector_requirement(rq: dict[str, Any]) -> Problems:
    """meta/v1/validation ValidateLabelSelectorRequirement."""
    op, values = rq.get("operator", ""), rq.get("values") or []
    out: Problems = _set_values(op, values)
    if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
        out.append((".operator", f"'{op}' is not a valid label selector operator: use "
                    f"{', '.join(LABEL_SELECTOR_OPERATORS)}"))
    out += [(".key", m) for m in names.qualified_name(rq.get("key", ""))]
    return out + _values(values)


def label_selector(sel: dict[str, Any]) -> Problems:
    """meta/v1/validation ValidateLabelSelector."""
    out = _under(".matchLabels", names.labels(sel.get("matchLabels") or {}))
    for i, rq in enumerate(sel.get("matchExpressions") or []):
        out += _under(f".matchExpressions[{i}]", label_selector_requirement(rq))
    return out


def _weight(term: dict[str, Any]) -> Problems:
    w = term.get("weight")
    return [] if w is None or 1 <= w <= 100 else [(".weight", f"{w} must be in the range 1-100")]


def pod_affinity_term(term: dict[str, Any]) -> Problems:
    """validatePodAffinityTerm: selectors, namespaces (DNS-1123 labels), a topology key."""
    out: Problems = []
    for part in ("labelSelector", "namespaceSelector"):
        if part in term:
            out += _under(f".{part}", label_selector(term[part]))
    out += [(f".namespaces[{i}]", m) for i, ns in enumerate(term.get("namespaces") or [])
            for m in names.dns1123_label(ns)]
    key = term.get("topologyKey", "")
    if not key:
        return out + [(".topologyKey", "required: a node label key such as kubernetes.io/hostname")]
    return out + [(".topologyKey", m) for m in names.qualified_name(key)]


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def affinity(a: dict[str, Any]) -> Problems:
    """validateAffinity: node affinity (validateNodeAffinity), pod affinity and anti-affinity."""
    out: Problems = []
    node = a.get("nodeAffinity") or {}
    if _REQUIRED in node:
        terms = node[_REQUIRED].get("nodeSelectorTerms") or []
        where = f".nodeAffinity.{_REQUIRED}.nodeSelectorTerms"
        if not terms:
            out.append((where, "must have at least one node selector term"))
        for i, term in enumerate(terms):
            out += _under(f"{where}[{i}]", node_selector_term(term))
    for i, term in enumerate(node.get(_PREFERRED) or []):
        where = f".nodeAffinity.{_PREFERRED}[{i}]"
        out += _under(where, _weight(term) + _under(".preference", node_selector_term(term.get("preference") or {})))
    for kind in ("podAffinity", "podAntiAffinity"):
        pod = a.get(kind) or {}
        for i, term in enumerate(pod.get(_REQUIRED) or []):
            out += _under(f".{kind}.{_REQUIRED}[{i}]", pod_affinity_term(term))
        for i, term in enumerate(pod.get(_PREFERRED) or []):
            found = _weight(term) + _under(".podAffinityTerm", pod_affinity_term(term.get("podAffinityTerm") or {}))
            out += _under(f".{kind}.{_PREFERRED}[{i}]", found)
    return out


def _object_name(where: str, name: Any) -> Problems:
    return [(where, m) for m in names.dns1123_subdomain(name)] if isinstance(name, str) and name else []


# The names of the objects a volume source refers to, by source.
_VOLUME_REFS = {"persistentVolumeClaim": "claimName", "configMap": "name", "secret": "secretName"}


def volume(v: dict[str, Any]) -> Problems:
    """validateVolumes: a DNS-1123 label as name; the Secret, ConfigMap or claim it names a valid name."""
    out: Problems = [(".name", m) for m in names.dns1123_label(v.get("name", ""))]
    for source, key in _VOLUME_REFS.items():
        if isinstance(v.get(source), dict):
            out += _object_name(f".{source}.{key}", v[source].get(key))
    return out


def env_var(e: dict[str, Any]) -> Problems:
    """validateEnv (relaxed names), validateSecretKeySelector / validateConfigMapKeySelector."""
    name = e.get("name", "")
    out: Problems = []
    if not name:
        out.append((".name", "required"))
    elif "=" in name or any(not 32 <= ord(c) <= 126 for c in name):
        out.append((".name", f"'{name}': an environment variable name is printable ASCII characters other than '='"))
    for ref in ("secretKeyRef", "configMapKeyRef"):
        sel = (e.get("valueFrom") or {}).get(ref)
        if isinstance(sel, dict):
            out += _object_name(f".valueFrom.{ref}.name", sel.get("name"))
            if sel.get("key"):
                out += [(f".valueFrom.{ref}.key", m) for m in names.config_map_key(sel["key"])]
    return out


# grpojob.api.k8s runs the rule of a vendored definition after its schema passes.
RULES: dict[str, Callable[[dict[str, Any]], Problems]] = {
    "Toleration": toleration, "ResourceRequirements": resources, "Affinity": affinity, "Volume": volume,
    "EnvVar": env_var,
}
