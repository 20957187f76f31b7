"""spec.model.lora: train a LoRA adapter (PEFT) instead of every weight of the policy."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Annotated, Optional

from pydantic import StringConstraints, ValidationInfo, field_validator

from grpojob.api.base import Model, deferring, field, invalid_all

ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer but the output layer
MAX_TARGET_MODULES = 64
# A causal LM's output layer (what transformers' get_output_embeddings() is in *ForCausalLM).
OUTPUT_LAYER = "lm_head"
# A module name suffix as PEFT matches it (q_proj, self_attn.o_proj) or the shorthand.
ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=128)]
Problems = list[tuple[str, str]]


def matches(target: str, module: str) -> bool:
    """Whether a target name selects a module, as PEFT matches a list of names
    (peft.tuners.tuners_utils.check_target_module_exists): the module's full name is the target or
    ends with '.' + target."""
    return module == target or module.endswith("." + target)


def output_layer_problems(targets: list[str], output_layer: str = OUTPUT_LAYER) -> Problems:
    """The targets that would put an adapter on the output layer: the trainer's log-probabilities
    read the output layer's weight directly (the fused, tiled log-softmax), so an adapter there
    would never see a gradient. One rule for validation and for the trainer (grpojob.learner.lora)."""
    return [(f"[{i}]", f"the output layer ({output_layer}) cannot take an adapter; name the decoder's linear "
             f"layers (or {ALL_LINEAR}, which leaves {output_layer} out)")
            for i, t in enumerate(targets) if t != ALL_LINEAR and matches(t, output_layer)]


def target_problems(targets: list[str]) -> Problems:
    """What can be refused without the model: the output layer, and names no module of any model
    can match (an empty part such as q_proj. or a..b; a parameter name such as q_proj.weight)."""
    out = output_layer_problems(targets)
    for i, t in enumerate(targets):
        parts = t.split(".")
        if "" in parts:
            out.append((f"[{i}]", f"'{t}' can match no module: a module name has no empty parts (e.g. "
                        "self_attn.q_proj)"))
        elif len(parts) > 1 and parts[-1] in ("weight", "bias"):
            out.append((f"[{i}]", f"'{t}' names a parameter, not a module: use {'.'.join(parts[:-1])}"))
    return out


def checkpoint_modules(model_dir: str | Path) -> Optional[set[str]]:
    """The modules of a local Hugging Face checkpoint that hold a matrix (2-D `.weight`: linear and
    embedding layers, what LoRA can adapt), read from the safetensors headers alone (no torch, no
    weights loaded); None when the directory holds no safetensors files to read."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    out: set[str] = set()
    for f in files:
        try:
            with open(f, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size)) if size < 100 * 2 ** 20 else None
        except (OSError, struct.error, ValueError):
            return None
        if not isinstance(header, dict):
            return None
        out |= {name.removesuffix(".weight") for name, t in header.items()
                if name.endswith(".weight") and isinstance(t, dict) and len(t.get("shape", ())) == 2}
    return out


def unmatched_targets(targets: list[str], modules: set[str]) -> Problems:
    """The targets that select no matrix module of a model (PEFT would refuse them at the trainer's
    start: "Target modules ... not found in the base model")."""
    if targets == [ALL_LINEAR]:
        return []
    layers = sorted({m.rsplit(".", 1)[-1] for m in modules})
    return [(f"[{i}]", f"'{t}' matches no linear layer of the model (its layers: {', '.join(layers)})")
            for i, t in enumerate(targets) if not any(matches(t, m) for m in modules)]


class LoraSpec(Model):
    """A LoRA adapter on the policy: only its matrices train, and only they are pushed to the
    rollout servers (docs/lora.md)."""

    rank: int = field(16, ge=1, le=1024, description="Rank r of the adapter's A (r x in) and B (out x r) matrices.")
    alpha: float = field(32.0, gt=0, description="LoRA alpha: the update B@A is scaled by alpha / rank.")
    dropout: float = field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[ModuleName] = field(
        default_factory=lambda: [ALL_LINEAR], min_length=1, max_length=MAX_TARGET_MODULES,
        description="Names (suffixes) of the linear modules that get an adapter, e.g. [q_proj, v_proj], "
        f"or [{ALL_LINEAR}]: every linear layer but the output layer ({OUTPUT_LAYER}, which cannot take one). "
        f"At most {MAX_TARGET_MODULES}.")

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if deferring(info):
            return v
        problems = []
        if ALL_LINEAR in v and len(v) > 1:
            problems.append((f"[{v.index(ALL_LINEAR)}]", f"{ALL_LINEAR} stands alone (it already names every "
                             "linear layer)"))
        problems += [(f"[{i}]", f"'{name}' is named twice") for i, name in enumerate(v) if name in v[:i]]
        problems += target_problems(v)
        if problems:
            raise invalid_all(problems)
        return v

    def peft_target_modules(self) -> str | list[str]:
        """target_modules as peft.LoraConfig takes it."""
        return ALL_LINEAR if self.target_modules == [ALL_LINEAR] else list(self.target_modules)
