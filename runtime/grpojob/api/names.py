"""The Kubernetes syntax of names, label keys and values, and annotations: what the API server
refuses in a pod's metadata, in the names of objects a GRPOJob refers to (Secrets, ConfigMaps,
PersistentVolumeClaims, StorageClasses, ServiceAccounts, PriorityClasses, queues, namespaces),
and in the label selectors of an affinity.

Sources (kubernetes/apimachinery):
- pkg/util/validation/validation.go: `IsQualifiedName`, `IsValidLabelValue`, `IsDNS1123Label`,
  `IsDNS1123Subdomain`, `IsConfigMapKey`;
- pkg/apis/meta/v1/validation/validation.go: `ValidateLabels`, `ValidateLabelName`;
- pkg/api/validation/objectmeta.go: `ValidateAnnotations`, `TotalAnnotationSizeLimitB`;
- pkg/api/validation/generic.go: `NameIsDNSSubdomain`, `NameIsDNSLabel` (the names of Secrets,
  ConfigMaps, PersistentVolumeClaims, StorageClasses, ServiceAccounts and PriorityClasses are DNS-1123
  subdomains; namespaces are DNS-1123 labels).

Each check returns the messages of what is wrong ([] when the value is valid), as the Go functions do.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, ValidationInfo, WithJsonSchema

from grpojob.api.base import deferring, invalid_all

Problems = list[tuple[str, str]]  # (sub-path relative to the value, message)

QUALIFIED_NAME_MAX = 63  # validation.go qualifiedNameMaxLength
LABEL_VALUE_MAX = 63  # validation.go LabelValueMaxLength
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
ANNOTATIONS_TOTAL_MAX = 256 * 1024  # objectmeta.go TotalAnnotationSizeLimitB
CONFIG_MAP_KEY_MAX = 253
# Bounds of grpojob's own label, annotation and node-selector maps: a CEL rule iterates their keys,
# and the API server costs a rule over an unbounded map as if it filled a request
# (docs/real-cluster-rules.md). Kubernetes itself has no such bound.
MAP_MAX = 64

_NAME_PART = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN = rf"^({_NAME_PART})?$"
# A qualified name (label and annotation keys) in one regular expression, for the CRD's CEL rules:
# an optional DNS-1123 subdomain prefix and '/', then a name of at most 63 characters. (The
# prefix's own 253-character bound needs a second length check that the CEL rule leaves to us.)
QUALIFIED_NAME_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")
_NAME_RE = re.compile(rf"^{_NAME_PART}$")
_LABEL_RE = re.compile(DNS1123_LABEL_PATTERN)
_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_PATTERN)
_CONFIG_MAP_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")

_NAME_WORDS = ("must be alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric "
               "character (e.g. 'MyName', 'my.name', '123-abc')")
_LABEL_WORDS = "lowercase alphanumeric characters or '-', starting and ending with an alphanumeric character"
_SUBDOMAIN_WORDS = ("lowercase alphanumeric characters, '-' or '.', starting and ending with an alphanumeric "
                    "character (e.g. 'example.com')")
# What a value that misses one of these patterns should be, in words (validate.py, k8s.py).
PATTERN_WORDS = {
    DNS1123_LABEL_PATTERN: f"must be a DNS-1123 label: at most {DNS1123_LABEL_MAX} {_LABEL_WORDS} (e.g. 'my-name')",
    DNS1123_SUBDOMAIN_PATTERN: f"must be a DNS-1123 subdomain: at most {DNS1123_SUBDOMAIN_MAX} {_SUBDOMAIN_WORDS}",
    LABEL_VALUE_PATTERN: f"must be a label value: empty, or at most {LABEL_VALUE_MAX} characters that {_NAME_WORDS}",
}


def dns1123_label(value: str) -> list[str]:
    """validation.go IsDNS1123Label."""
    out = []
    if len(value) > DNS1123_LABEL_MAX:
        out.append(f"must be no more than {DNS1123_LABEL_MAX} characters")
    if not _LABEL_RE.match(value):
        out.append(f"'{value}' is not a DNS-1123 label: {_LABEL_WORDS} (e.g. 'my-name')")
    return out


def dns1123_subdomain(value: str) -> list[str]:
    """validation.go IsDNS1123Subdomain (the names of most objects: generic.go NameIsDNSSubdomain)."""
    out = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        out.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if not _SUBDOMAIN_RE.match(value):
        out.append(f"'{value}' is not a DNS-1123 subdomain: {_SUBDOMAIN_WORDS}")
    return out


def qualified_name(value: str) -> list[str]:
    """validation.go IsQualifiedName: label keys, annotation keys, toleration and topology keys."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return [f"'{value}': the prefix before '/' must be non-empty"]
        bad = dns1123_subdomain(prefix)
        if bad:
            return [f"'{value}': the prefix before '/' must be a DNS-1123 subdomain ({bad[-1]})"]
    else:
        return [f"'{value}': a qualified name is a name with an optional DNS subdomain prefix and '/' "
                "(e.g. 'MyName' or 'example.com/MyName')"]
    if not name:
        return [f"'{value}': the name part must be non-empty"]
    out = []
    if len(name) > QUALIFIED_NAME_MAX:
        out.append(f"'{value}': the name part must be no more than {QUALIFIED_NAME_MAX} characters")
    if not _NAME_RE.match(name):
        out.append(f"'{value}': the name part {_NAME_WORDS}")
    return out


def label_value(value: str) -> list[str]:
    """validation.go IsValidLabelValue (the empty string is a valid label value)."""
    out = []
    if len(value) > LABEL_VALUE_MAX:
        out.append(f"'{value}' must be no more than {LABEL_VALUE_MAX} characters")
    if value and not _NAME_RE.match(value):
        out.append(f"'{value}': a label value {_NAME_WORDS}")
    return out


def config_map_key(value: str) -> list[str]:
    """validation.go IsConfigMapKey (keys of Secrets and ConfigMaps)."""
    out = []
    if len(value) > CONFIG_MAP_KEY_MAX:
        out.append(f"must be no more than {CONFIG_MAP_KEY_MAX} characters")
    if not _CONFIG_MAP_KEY_RE.match(value):
        out.append(f"'{value}': a valid key consists of alphanumeric characters, '-', '_' or '.'")
    elif value in (".", "..") or value.startswith(".."):
        out.append(f"'{value}' must not be '.' or '..' or start with '..'")
    return out


def labels(value: dict[str, Any]) -> Problems:
    """meta/v1/validation ValidateLabels: every key a qualified name, every value a label value."""
    out: Problems = []
    for key, v in value.items():
        out += [(f"[{key}]", m) for m in qualified_name(key)]
        if isinstance(v, str):
            out += [(f"[{key}]", m) for m in label_value(v)]
    return out


def annotations(value: dict[str, Any]) -> Problems:
    """objectmeta.go ValidateAnnotations: every key a qualified name (compared in lower case), and
    keys and values together at most 256 KiB."""
    out: Problems = [(f"[{key}]", m) for key in value for m in qualified_name(key.lower())]
    total = sum(len(k) + len(v) for k, v in value.items() if isinstance(v, str))
    if total > ANNOTATIONS_TOTAL_MAX:
        out.append(("", f"annotations may total at most {ANNOTATIONS_TOTAL_MAX} bytes (keys and values), "
                    f"not {total}"))
    return out


def _checked(rule: Callable[[Any], Problems]) -> AfterValidator:
    def check(value: Any, info: ValidationInfo) -> Any:
        if deferring(info):
            return value
        found = rule(value)
        if found:
            raise invalid_all(found)
        return value
    return AfterValidator(check)


def _name(check: Callable[[str], list[str]], pattern: str) -> Callable[[Any], Problems]:
    """A name rule that says what a name must be (the pattern's words) when the name breaks it."""
    return lambda value: [("", PATTERN_WORDS[pattern])] if check(value) else []


# CEL rules the CRD carries on these maps (tests/api/test_cluster_rules.py evaluates them with a
# real CEL engine against the Python rules above).
def cel_string(text: str) -> str:
    """`text` as a single-quoted CEL string literal (backslashes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


LABEL_KEYS_RULE = f"self.all(k, k.matches({cel_string(QUALIFIED_NAME_PATTERN)}))"
ANNOTATION_KEYS_RULE = f"self.all(k, k.matches({cel_string('(?i)' + QUALIFIED_NAME_PATTERN)}))"
_LABEL_SCHEMA = {"additionalProperties": {"type": "string", "maxLength": LABEL_VALUE_MAX,
                                          "pattern": LABEL_VALUE_PATTERN},
                 "x-kubernetes-validations": [{"rule": LABEL_KEYS_RULE, "message": "label keys must be qualified "
                                               "names such as app or example.com/role"}]}
_ANNOTATION_SCHEMA = {"x-kubernetes-validations": [{"rule": ANNOTATION_KEYS_RULE, "message": "annotation keys "
                                                    "must be qualified names such as example.com/note"}]}

# Pydantic types of the spec's own Kubernetes names and maps.
Labels = Annotated[dict[str, str], _checked(labels)]
Annotations = Annotated[dict[str, str], _checked(annotations)]
# Names are checked by the local rules (so they report beside the cross-field rules); the CRD gets
# their pattern and length.
ObjectName = Annotated[str, _checked(_name(dns1123_subdomain, DNS1123_SUBDOMAIN_PATTERN)),
                       WithJsonSchema({"type": "string", "pattern": DNS1123_SUBDOMAIN_PATTERN,
                                       "maxLength": DNS1123_SUBDOMAIN_MAX})]
LabelName = Annotated[str, _checked(_name(dns1123_label, DNS1123_LABEL_PATTERN)),
                      WithJsonSchema({"type": "string", "pattern": DNS1123_LABEL_PATTERN,
                                      "maxLength": DNS1123_LABEL_MAX})]


def labels_field(description: str) -> dict[str, Any]:
    """field() keywords of a label map (pod labels, a node selector)."""
    return {"default_factory": dict, "max_length": MAP_MAX, "json_schema_extra": _LABEL_SCHEMA,
            "description": f"{description} At most {MAP_MAX}."}


def annotations_field(description: str) -> dict[str, Any]:
    return {"default_factory": dict, "max_length": MAP_MAX, "json_schema_extra": _ANNOTATION_SCHEMA,
            "description": f"{description} At most {MAP_MAX}."}
