"""Reading a GRPOJob manifest from a file, with `--set` overrides: one function for `grpojob validate`,
`grpojob run` and `grpojob render`."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from grpojob.api.validate import FieldError, InvalidSpec


class _Loader(yaml.SafeLoader):
    """YAML as the Kubernetes API server reads it (YAML 1.2 numbers): `1e-6` is a float, where
    PyYAML's YAML 1.1 rules make it a string ("must be a number" for a learning rate that kubectl
    accepts)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def load_file(path: str | Path) -> Any:
    """Read the GRPOJob document of a YAML file (the first document of kind GRPOJob)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidSpec([FieldError("", f"cannot read {path}: {e.strerror}")]) from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as e:
        raise InvalidSpec([FieldError("", f"{path}: not valid YAML: {e}")]) from None
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "GRPOJob":
            return d
    if len(docs) == 1:
        return docs[0]
    raise InvalidSpec([FieldError("kind", f"{path}: no document of kind GRPOJob")])


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    """Apply a `--set a.b.c=value` override (the path is relative to spec unless it starts with a
    top-level key); the value is parsed as YAML so numbers and booleans keep their types."""
    keys = dotted.split(".")
    if keys[0] not in ("spec", "metadata"):
        keys = ["spec", *keys]
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise InvalidSpec([FieldError(dotted, "cannot set a field inside a non-object")])
    node[keys[-1]] = parse_yaml(value) if isinstance(value, str) else value


def load_manifest(path: str | Path, sets: Iterable[str] = ()) -> dict[str, Any]:
    """The GRPOJob document of a file with each `KEY=VALUE` override applied (not yet validated)."""
    doc = load_file(path)
    if not isinstance(doc, dict):
        raise InvalidSpec([FieldError("", f"{path}: a GRPOJob manifest must be a YAML mapping")])
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq:
            raise InvalidSpec([FieldError(key, "--set needs KEY=VALUE")])
        set_path(doc, key, value)
    return doc
