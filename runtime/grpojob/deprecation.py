"""Old module paths that keep working for a while: a forwarding module is the new module under its
old name, and importing it warns once with the path to use and the version that drops it.

Why a DeprecationWarning subclass shown by default: Python hides DeprecationWarning outside
`__main__`, and a plug-in is imported by grpojob's resolver, so a plain one would never reach the
user who must change the import. Running with -W (or PYTHONWARNINGS) leaves the choice to them:
`-W error::DeprecationWarning` turns these into errors.
"""
from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

# The release that removes every forwarding path added in 0.2 (CHANGELOG.md, version policy).
REMOVED_IN = "0.3"


class GrpojobDeprecationWarning(DeprecationWarning):
    """An import path or name of grpojob that a later release removes."""


if not sys.warnoptions:
    warnings.filterwarnings("default", category=GrpojobDeprecationWarning)


def message(old: str, new: str, removed_in: str = REMOVED_IN) -> str:
    return f"{old} is deprecated: import from {new} instead; {old} will be removed in grpojob {removed_in}"


def forward(old: str, module: ModuleType, new: str, removed_in: str = REMOVED_IN,
            submodules: tuple[str, ...] = ()) -> None:
    """Make the module named `old` (the caller, being imported) be `module` itself, so every name,
    private ones and later monkeypatches included, stays the same object; warn with `new`, the path
    to use instead (a public one, e.g. grpojob.plugins, where the name is part of it).

    A moved package names its `submodules`: they are aliased too, else `import old.sub` would find
    them through the new package's path and load a second copy of their classes."""
    # stacklevel 3: the import statement of whoever imported `old` (past this call and its module body)
    warnings.warn(message(old, new, removed_in), GrpojobDeprecationWarning, stacklevel=3)
    for sub in submodules:
        sys.modules[f"{old}.{sub}"] = importlib.import_module(f"{module.__name__}.{sub}")
    sys.modules[old] = module
