"""The public surface of grpojob: every name a user's code may import, with its signature.

python -m tools.public_surface           print the differences from the checked-in snapshot
python -m tools.public_surface --write   rewrite the snapshot (a deliberate change of the surface:
                                         add its CHANGELOG.md line, and forward what was removed)

tests/plugins/test_public_surface.py compares the package with tests/plugins/public_surface.json.
"""
from __future__ import annotations

import importlib
import inspect
import re
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "plugins" / "public_surface.json"
# The modules users import (docs/plugins.md, docs/service.md, CHANGELOG.md's version policy).
MODULES = ("grpojob", "grpojob.plugins", "grpojob.plugins.dist", "grpojob.plugins.weights",
           "grpojob.plugins.builtins", "grpojob.client",
           # other libraries' adapters that user code names (docs/environments.md, docs/plugins.md#frameworks)
           "grpojob.integrations.trl_env", "grpojob.integrations.skyrl_gym", "grpojob.integrations.episodes",
           "grpojob.integrations.areal", "grpojob.integrations.trl_rollout", "grpojob.integrations.verifiers_v1",
           "grpojob.integrations.art", "grpojob.integrations.verl", "grpojob.integrations.areal_agent")


def _signature(obj: Any) -> str:
    try:
        text = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    # inspect prints a typing form bare or as `typing.X` depending on how pydantic last built the
    # model's signature (it differed within one CI process): the name is what a user relies on.
    return re.sub(r"\btyping\.", "", text)


def describe(obj: Any) -> Any:
    """What a user relies on: a function's signature; a class's constructor, bases and public
    methods and attributes (a subclass overrides them); a module's names; a constant's value."""
    if inspect.ismodule(obj):
        return {"module": obj.__name__.removeprefix("grpojob.") if obj.__name__ != "grpojob" else "grpojob"}
    if inspect.isclass(obj):
        members = {}
        for name, value in vars(obj).items():
            if name.startswith("_") and name not in ("__call__", "__len__", "__getitem__"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                members[name] = "property"
            elif callable(value):
                members[name] = _signature(value)
        fields = getattr(obj, "__annotations__", {})
        return {"class": _signature(obj), "bases": [b.__name__ for b in obj.__bases__],
                "members": dict(sorted(members.items())),
                "fields": sorted(n for n in fields if not n.startswith("_"))}
    if callable(obj):
        return {"function": _signature(obj)}
    if isinstance(obj, (str, int, float, bool, tuple)):
        return {"value": list(obj) if isinstance(obj, tuple) else obj}
    if isinstance(obj, dict):
        return {"keys": sorted(map(str, obj))}
    return {"type": type(obj).__name__}


def surface() -> dict[str, dict[str, Any]]:
    out = {}
    for name in MODULES:
        module = importlib.import_module(name)
        # the version's value changes every release; that it is there is the promise
        out[name] = {n: {"type": "str"} if n == "__version__" else describe(getattr(module, n))
                     for n in sorted(module.__all__)}
    return out


def differences(old: dict, new: dict) -> list[str]:
    """One line per removed, added or changed name ('removed' and 'changed' break users' code)."""
    lines = []
    for module in sorted(set(old) | set(new)):
        a, b = old.get(module, {}), new.get(module, {})
        lines += [f"removed: {module}.{n}" for n in sorted(set(a) - set(b))]
        lines += [f"changed: {module}.{n}: {json.dumps(a[n])} -> {json.dumps(b[n])}"
                  for n in sorted(set(a) & set(b)) if a[n] != b[n]]
        lines += [f"added: {module}.{n}" for n in sorted(set(b) - set(a))]
    return lines


def main(argv: list[str]) -> int:
    now = surface()
    if "--write" in argv:
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
        return 0
    diff = differences(json.loads(SNAPSHOT.read_text()), now)
    print("\n".join(diff) or "the public surface matches the snapshot")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
