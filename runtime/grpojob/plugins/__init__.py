"""The public surface for plug-in authors: everything a plug-in may import from grpojob.

Import from here (`from grpojob.plugins import GRPOTrainer, Group, SamplingParams`), never from
grpojob's internal packages: those move between releases; the names and signatures here change only
through a deprecation (CHANGELOG.md, version policy). tests/plugins/test_public_surface.py pins them
against tests/plugins/public_surface.json.

- contracts: GRPOTrainer (subclass it, docs/plugins.md#the-trainer-hooks), Algorithm, Engine (and
  HFEngine to subclass), Workflow and its Generator (GroupRejected drops a group), DatasetClass, the three reward signatures,
  Callback;
- rollout types: Completion, Group, Sample, SamplingParams, derive_seed;
- what hooks and callbacks receive: Prepared, TrainSeq, MicroBatch, LossTerms, StepRecord,
  EvalRecord; TrainerError refuses a spec;
- `dist`: the collectives a custom trainer calls (grpojob.plugins.dist);
- weights for an engine: WeightReceiver, read_dir, read_delta, is_delta, INITIAL_WEIGHTS (grpojob.plugins.weights);
- the job's rewards inside a workflow (RewardScorer); the built-in datasets and rewards by name.

Each name is imported when first used, as `from grpojob import GRPOTrainer` is: a reward function
or a Tinker-style loop that takes only torch-free names does not import torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it (the only place that says where a public name lives)
_EXPORTS = {
    # contracts
    "GRPOTrainer": "grpojob.learner.trainer",
    "TrainerError": "grpojob.learner.errors",
    "Algorithm": "grpojob.algorithms",
    "register_algorithm": "grpojob.algorithms",
    "Engine": "grpojob.contracts.protocols",
    "WeightSink": "grpojob.contracts.protocols",
    "HFEngine": "grpojob.rollout.hf_engine",
    "Workflow": "grpojob.contracts.rollout",
    "Generator": "grpojob.contracts.rollout",
    "GroupRejected": "grpojob.contracts.rollout",
    "DatasetClass": "grpojob.contracts.protocols",
    "NativeReward": "grpojob.contracts.protocols",
    "CosmosReward": "grpojob.contracts.protocols",
    "TrlReward": "grpojob.contracts.protocols",
    "REWARD_SIGNATURES": "grpojob.api.plugins",
    "Callback": "grpojob.contracts.protocols",
    # rollout types
    "Completion": "grpojob.contracts.rollout",
    "Group": "grpojob.contracts.rollout",
    "Sample": "grpojob.contracts.rollout",
    "SamplingParams": "grpojob.contracts.rollout",
    "derive_seed": "grpojob.contracts.rollout",
    # what hooks and callbacks receive
    "Prepared": "grpojob.learner.batch",
    "TrainSeq": "grpojob.learner.packing",
    "MicroBatch": "grpojob.learner.packing",
    "LossTerms": "grpojob.algorithms",
    "StepRecord": "grpojob.leader.record",
    "EvalRecord": "grpojob.leader.evaluation",
    # helpers
    "RewardScorer": "grpojob.rewards",
    "WeightReceiver": "grpojob.plugins.weights",
    "WeightSyncError": "grpojob.plugins.weights",
    "read_dir": "grpojob.plugins.weights",
    "read_delta": "grpojob.plugins.weights",
    "is_delta": "grpojob.plugins.weights",
    "INITIAL_WEIGHTS": "grpojob.plugins.weights",
    "builtin_dataset": "grpojob.plugins.builtins",
    "builtin_reward": "grpojob.plugins.builtins",
    "TOY_CATEGORIES": "grpojob.plugins.builtins",
}
_ALIASES = {"register_algorithm": "register"}  # the public name differs from the defining one
_SUBMODULES = ("dist", "weights", "builtins")

__all__ = sorted([*_EXPORTS, "dist"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), _ALIASES.get(name, name))
        globals()[name] = value  # once: later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'grpojob.plugins' has no attribute '{name}' (its names: {', '.join(__all__)})")


def __dir__() -> list[str]:
    return sorted({*__all__, *_SUBMODULES})


if TYPE_CHECKING:  # what the names are, for type checkers and editors (the lazy map above is the runtime)
    from grpojob.algorithms import Algorithm, LossTerms
    from grpojob.algorithms import register as register_algorithm
    from grpojob.contracts.protocols import (Callback, CosmosReward, DatasetClass, Engine, NativeReward, TrlReward,
                                       WeightSink)
    from grpojob.api.plugins import REWARD_SIGNATURES
    from grpojob.contracts.rollout import (Completion, Generator, Group, GroupRejected, Sample, SamplingParams, Workflow,
                                          derive_seed)
    from grpojob.leader.evaluation import EvalRecord
    from grpojob.leader.record import StepRecord
    from grpojob.learner.batch import Prepared
    from grpojob.learner.errors import TrainerError
    from grpojob.learner.packing import MicroBatch, TrainSeq
    from grpojob.learner.trainer import GRPOTrainer
    from grpojob.plugins import dist
    from grpojob.plugins.builtins import TOY_CATEGORIES, builtin_dataset, builtin_reward
    from grpojob.plugins.weights import INITIAL_WEIGHTS, WeightReceiver, WeightSyncError, is_delta, read_delta, read_dir
    from grpojob.rewards import RewardScorer
    from grpojob.rollout.hf_engine import HFEngine
