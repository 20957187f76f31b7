"""LoRA adapters on the wire and on disk, in PEFT's format (what `PeftModel.save_pretrained`
writes and vLLM's LoRA loader reads): a directory with adapter_config.json and
adapter_model.safetensors, tensors named `base_model.model.<module>.lora_A.weight` (r x in) and
`...lora_B.weight` (out x r).

A LoRA push carries these tensors and the config (`TensorStream.adapter`, the push command's
"adapter"); the checkpoint backend writes such a directory. Engines that keep the base weights
apply it: vLLM serves it as a LoRA adapter, the hf engine merges it into the base weights
(`merged`: W = W_base + scale * B @ A for each adapted linear layer).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from grpojob.sync.tensorfiles import write_safetensors
from grpojob.sync.stream import TensorStream

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"


def save(path: str | Path, adapter: TensorStream) -> int:
    """Write an adapter stream as a PEFT adapter directory; returns the tensor bytes."""
    if adapter.adapter is None:
        raise ValueError("not an adapter stream (no PEFT config)")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG).write_text(json.dumps(adapter.adapter, indent=2, sort_keys=True) + "\n")
    return write_safetensors(path / WEIGHTS, adapter)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG).is_file()


def read(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """(config, named tensors) of a PEFT adapter directory."""
    from safetensors.torch import load_file

    path = Path(path)
    return json.loads((path / CONFIG).read_text()), list(load_file(str(path / WEIGHTS)).items())


def scale(config: Mapping[str, Any]) -> float:
    """The factor of B @ A: alpha / r (alpha / sqrt(r) with rsLoRA)."""
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def check_supported(config: Mapping[str, Any]) -> None:
    """What `merged` computes: plain LoRA with one rank and alpha for every module."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"adapter type {config.get('peft_type')} is not LoRA")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "fan_in_fan_out"):
        if config.get(key):
            raise ValueError(f"LoRA adapters with {key} are not supported by the merge")


def pairs(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Module weight name (the base model's state-dict name, e.g. model.layers.0.mlp.up_proj.weight)
    -> (A, B). Every tensor must be a lora_A or lora_B weight with its partner present."""
    a, b = {}, {}
    for name, t in named:
        if not name.startswith(PREFIX) or not name.endswith((_A, _B)):
            raise ValueError(f"adapter tensor '{name}' is not a LoRA A/B weight of a linear layer "
                             f"({PREFIX}<module>{_A} or {_B})")
        module = name[len(PREFIX):-len(_A)]
        (a if name.endswith(_A) else b)[module + ".weight"] = t
    if set(a) != set(b):
        raise ValueError(f"adapter lacks the partner of {sorted(set(a) ^ set(b))[:3]}")
    return {k: (a[k], b[k]) for k in a}


def merged(base: Mapping[str, torch.Tensor], adapted: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
           config: Mapping[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """(weight name, W_base + scale * B @ A) for every adapted module, in the base's dtype and
    device (computed in float32). `base`: the base weights by state-dict name; `adapted`: pairs()."""
    check_supported(config)
    s = scale(config)
    out = []
    for name, (a, b) in adapted.items():
        w = base.get(name)
        if w is None:
            raise ValueError(f"the adapter adapts '{name[:-len('.weight')]}', which the model lacks")
        if (b.shape[0], a.shape[1]) != tuple(w.shape) or a.shape[0] != b.shape[1]:
            raise ValueError(f"adapter of {name}: B {tuple(b.shape)} @ A {tuple(a.shape)} does not fit "
                             f"the weight {tuple(w.shape)}")
        delta = b.to(w.device, torch.float32) @ a.to(w.device, torch.float32)
        out.append((name, (w.float() + s * delta).to(w.dtype)))
    return out
