"""grpojob: Kubernetes-native GRPO reinforcement learning for LLMs.

The top-level package imports nothing heavy: the operator image has no torch. The classes users
subclass in their plug-ins are exported lazily (`from grpojob import GRPOTrainer` imports torch
then, not before).
"""
__version__ = "0.1.0"

_LAZY = {
    "GRPOTrainer": "grpojob.learner.trainer",
    "Callback": "grpojob.contracts.protocols",
    "Algorithm": "grpojob.algorithms",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpojob' has no attribute '{name}'")
