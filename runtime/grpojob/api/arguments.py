"""Keyword arguments a spec passes to user code (`spec.dataset.args` for a dataset factory or class),
checked against the callee's signature at validation time, as the call itself would check them,
instead of at the trainer's start: unknown keywords, missing required arguments, and values that
do not fit a simple annotation (int, float, str, bool, list[...], dict[...], Optional, Literal).

The built-in dataset factories live in the runtime (grpojob.data.builtin, which the API may not
import): their signatures are declared here, and tests/api/test_cluster_rules.py checks that each
declaration matches its function.
"""
from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any, Callable, Literal, Optional

Problems = list[tuple[str, str]]


def _toy(categories: Optional[list[str]] = None, size: int = 64, seed: int = 0) -> None:
    """grpojob.data.builtin.toy"""


def _countdown(size: int = 256, count: int = 3, max_number: int = 20, seed: int = 0) -> None:
    """grpojob.data.builtin.countdown"""


def _reasoning_gym(tasks: list[dict], size: int = 1000, seed: int = 0, split: Literal["train", "test"] = "train",
                   system_prompt: str = "default", prefill: bool = False) -> None:
    """grpojob.data.reasoning.reasoning_gym (its tasks are checked by grpojob.data.reasoning.check_args)"""


BUILTIN_DATASETS: dict[str, Callable[..., Any]] = {"toy": _toy, "countdown": _countdown,
                                                   "reasoning-gym": _reasoning_gym}
# Built-in datasets whose args only their package can judge (task names, configs): checked where
# plug-ins are (validate.check_plugins: the CLI and the trainer), not in the operator.
BUILTIN_ARG_CHECKS = {"reasoning-gym": "grpojob.data.reasoning:check_args"}

_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
          tuple: "a list", dict: "an object", type(None): "null"}
_NAMES = {**{t.__name__: t for t in (bool, int, float, str, list, tuple, dict)}, "None": None,
          "Optional": Optional, "Union": typing.Union, "List": list, "Dict": dict, "Any": Any,
          "Literal": Literal, "Tuple": tuple}


def _annotation(ann: Any) -> Any:
    """An annotation as an object: a string (from `from __future__ import annotations`) evaluated
    with the builtins and typing names only; Any when it names something else."""
    if isinstance(ann, str):
        try:
            return eval(ann, {"__builtins__": {}}, dict(_NAMES))  # noqa: S307 - names above only
        except Exception:
            return Any
    return ann


def expected(ann: Any, value: Any) -> Optional[str]:
    """None when `value` fits the annotation `ann` (or `ann` is not a simple type this can judge),
    else what a fitting value is, in words."""
    ann = _annotation(ann)
    if ann is inspect.Parameter.empty or ann is Any or ann is object:
        return None
    origin, params = typing.get_origin(ann), typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        if any(expected(p, value) is None for p in params):
            return None
        return " or ".join(expected(p, _Nothing) or "" for p in params)
    if origin is Literal:
        return None if value in params else "one of " + ", ".join(map(repr, params))
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, list):
            item = expected(params[0], _Nothing) if params and origin is list else None
            return f"a list of {_plural(item)}" if item else "a list"
        if origin is list and params:
            bad = next((v for v in value if expected(params[0], v) is not None), _Nothing)
            if bad is not _Nothing:
                return f"a list of {_plural(expected(params[0], _Nothing))}"
        return None
    if origin in (dict, collections.abc.Mapping):
        return None if isinstance(value, dict) else "an object"
    if ann is None or ann is type(None):
        return None if value is None else "null"
    if ann in _WORDS:
        if ann is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif ann is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif ann is tuple:
            ok = isinstance(value, list)
        else:
            ok = isinstance(value, ann)
        return None if ok else _WORDS[ann]
    return None  # a class of the user's own: the call decides


class _NothingType:
    """A value that fits nothing: expected(ann, _Nothing) is the words of `ann`."""


_Nothing = _NothingType()


def _plural(words: Optional[str]) -> str:
    if not words:
        return "values"
    return {"an integer": "integers", "a number": "numbers", "a string": "strings", "an object": "objects",
            "true or false": "booleans"}.get(words, words)


def _signature(fn: Any) -> Optional[inspect.Signature]:
    for kw in ({"eval_str": True}, {}):
        try:
            return inspect.signature(fn, **kw)
        except (NameError, TypeError, ValueError, SyntaxError):
            continue
    return None


def problems(fn: Any, args: dict[str, Any], what: str = "the function") -> Problems:
    """(sub-path under args, message) for every argument `fn(**args)` would refuse."""
    sig = _signature(fn)
    if sig is None:
        return []
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    by_keyword = {n: p for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out: Problems = []
    for name, value in args.items():
        if name not in by_keyword:
            if not takes_any:
                known = ", ".join(by_keyword) or "no keyword arguments"
                out.append((f".{name}", f"unknown argument: {what} takes {known}"))
            continue
        words = expected(by_keyword[name].annotation, value)
        if words:
            out.append((f".{name}", f"must be {words} (as {what} annotates it), not {value!r}"))
    for name, p in params.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in args:
            out.append(("", f"missing required argument '{name}' of {what}"))
        elif p.default is p.empty and p.kind is p.POSITIONAL_ONLY:
            out.append(("", f"{what} takes a positional-only argument '{name}', which args cannot give"))
    return out
