"""GRPO-family algorithms: a registry of built-ins (names = grpojob.api.plugins.BUILTIN_ALGORITHMS)
plus user classes by 'module:Class' (subclasses of Algorithm) or registered with `register`."""
from __future__ import annotations

from typing import Callable

from grpojob.api import plugins
from grpojob.api.spec import AlgorithmSpec
from grpojob.algorithms.base import Algorithm, LossTerms, Settings, TokenBatch
from grpojob.algorithms.builtin import BUILTINS

REGISTRY: dict[str, type[Algorithm]] = dict(BUILTINS)


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: make an Algorithm subclass available under `name`."""
    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        _check(name, cls)
        REGISTRY[name] = cls
        return cls
    return deco


def check_class(cls: object) -> str | None:
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        return "is not a subclass of grpojob.algorithms.Algorithm"
    return None


def _check(name: str, cls: object) -> None:
    why = check_class(cls)
    if why:
        raise TypeError(f"algorithm '{name}' {why}")


def resolve(name: str) -> type[Algorithm]:
    if name in REGISTRY:
        return REGISTRY[name]
    if not plugins.is_reference(name):
        raise ValueError(f"spec.algorithm.name: unknown algorithm '{name}' (use one of "
                         f"{', '.join(REGISTRY)} or 'module:Class')")
    cls = plugins.resolve(name)
    _check(name, cls)
    return cls


def build(spec: AlgorithmSpec, max_tokens: int) -> Algorithm:
    """The algorithm named by spec.name, configured from the spec."""
    return resolve(spec.name)(spec, max_tokens)


__all__ = ["Algorithm", "LossTerms", "Settings", "TokenBatch", "REGISTRY", "register", "resolve", "build",
           "check_class"]
