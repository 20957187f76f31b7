"""Names of the built-in plug-ins, and the `module:attr` rule for everything else.

This is the one list of built-in names: the spec validates against it without importing
torch, and each runtime registry asserts it implements exactly these names.
"""
from __future__ import annotations

import importlib
import re

BUILTIN_ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp")
BUILTIN_REWARDS = ("math_exact", "format", "countdown", "exact_match", "toy")
BUILTIN_DATASETS = ("toy", "countdown")
BUILTIN_WORKFLOWS = ("single-turn", "greedy-baseline")
# rollout.workflow `none`: the trainer generates nothing itself; its groups come from environments.
NO_WORKFLOW = "none"

KINDS = {
    "algorithm": BUILTIN_ALGORITHMS,
    "reward": BUILTIN_REWARDS,
    "dataset": BUILTIN_DATASETS,
    "workflow": (*BUILTIN_WORKFLOWS, NO_WORKFLOW),
}

# `module:attr` (dotted on both sides). The CRD pattern and the validator share it; a new kind of
# reference (a file path, say) is one more alternative in REFERENCE_PATTERNS.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE_ATTR = rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*"
REFERENCE_PATTERNS: tuple[str, ...] = (MODULE_ATTR,)
_REF = re.compile("^(" + "|".join(REFERENCE_PATTERNS) + ")$")


def name_pattern(kind: str) -> str:
    """The CRD's pattern for a plug-in name of `kind`: a built-in or a well-formed reference (the API
    server refuses anything else; the validator's own message says which names exist)."""
    return "^(" + "|".join((*KINDS[kind], *REFERENCE_PATTERNS)) + ")$"


def is_reference(name: str) -> bool:
    return ":" in name


def check_name(kind: str, name: str) -> str | None:
    """An error message, or None when `name` is a built-in or a well-formed `module:attr`."""
    builtins = KINDS[kind]
    if name in builtins:
        return None
    if not is_reference(name):
        return f"unknown {kind} '{name}': use one of {', '.join(builtins)} or 'module:attr'"
    if not _REF.match(name):
        return f"'{name}' is not a valid 'module:attr' reference"
    return None


def resolve(name: str):
    """Import a `module:attr` reference; raises ImportError/AttributeError with a clear message."""
    module_name, _, attr = name.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"cannot import module '{module_name}': {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module '{module_name}' has no attribute '{attr}'") from None
    return obj
