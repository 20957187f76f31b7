"""spec.model.lora: train a LoRA adapter (PEFT) instead of every weight of the policy."""
from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints, field_validator

from .base import Model, field, invalid

ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer but the output layer
MAX_TARGET_MODULES = 64
# A module name suffix as PEFT matches it (q_proj, self_attn.o_proj) or the shorthand.
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=128)]


class LoraSpec(Model):
    """A LoRA adapter on the policy: only its matrices train, and only they are pushed to the
    rollout servers (docs/lora.md)."""

    rank: int = field(16, ge=1, le=1024, description="Rank r of the adapter's A (r x in) and B (out x r) matrices.")
    alpha: float = field(32.0, gt=0, description="LoRA alpha: the update B@A is scaled by alpha / rank.")
    dropout: float = field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[ModuleName] = field(
        default_factory=lambda: [ALL_LINEAR], min_length=1, max_length=MAX_TARGET_MODULES,
        description="Names (suffixes) of the linear modules that get an adapter, e.g. [q_proj, v_proj], "
        f"or [{ALL_LINEAR}]: every linear layer but the output layer. At most {MAX_TARGET_MODULES}.")

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if ALL_LINEAR in v and len(v) > 1:
            raise invalid(f"[{v.index(ALL_LINEAR)}]", f"{ALL_LINEAR} stands alone (it already names every linear layer)")
        for i, name in enumerate(v):
            if name in v[:i]:
                raise invalid(f"[{i}]", f"'{name}' is named twice")
        return v

    def peft_target_modules(self) -> str | list[str]:
        """target_modules as peft.LoraConfig takes it."""
        return ALL_LINEAR if self.target_modules == [ALL_LINEAR] else list(self.target_modules)
