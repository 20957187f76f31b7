"""spec.trainer.class: the learner class a job trains with, checked before it is built.

A trainer plug-in subclasses grpojob.GRPOTrainer and overrides some of its hooks (HOOKS); each
override must accept the arguments the loop passes to the base method (it may add optional ones).
"""
from __future__ import annotations

import inspect
from typing import Optional

from grpojob.api import plugins
from grpojob.learner.trainer import GRPOTrainer, TrainerError

FIELD = "spec.trainer.class"
HOOKS = ("load_tokenizer", "load_model", "build_reference", "build_optimizer", "build_lr_scheduler",
         "compute_advantages", "prepare_batch", "compute_logprobs", "loss_fn", "step_training", "optimize",
         "weight_stream", "sharded_state", "load_sharded_state", "export_model", "load_state")


def _accepts(override, base) -> bool:
    """`override` can be called the way the loop calls `base` (positionally, every base parameter)."""
    try:
        params = [p for p in inspect.signature(base).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        inspect.signature(override).bind(*[None] * len(params))
    except TypeError:
        return False
    except ValueError:  # no signature (a C callable): trust it
        return True
    return True


def check_class(cls) -> Optional[str]:
    """Why `cls` cannot be the job's trainer, or None."""
    if not (inspect.isclass(cls) and issubclass(cls, GRPOTrainer)):
        return "is not a subclass of grpojob.GRPOTrainer"
    for name in HOOKS:
        mine, base = getattr(cls, name), getattr(GRPOTrainer, name)
        if mine is base:
            continue
        if not callable(mine):
            return f"overrides the hook {name} with a non-callable"
        if not _accepts(mine, base):
            want = str(inspect.signature(base)).replace("'", "")
            return f"overrides the hook {name} with signature {inspect.signature(mine)}; it must accept {want}"
    return None


def trainer_class(name: Optional[str]) -> type[GRPOTrainer]:
    """The class spec.trainer.class names (None: GRPOTrainer); TrainerError naming the field."""
    if name is None:
        return GRPOTrainer
    return plugins.load_checked(name, FIELD, check_class, TrainerError)
