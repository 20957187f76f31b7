"""LoRA on the policy (spec.model.lora), through PEFT's public API only.

`attach` injects the adapter into the Hugging Face model in place (`peft.get_peft_model`): the
trainer keeps computing with the same *ForCausalLM (its linear layers now carry lora_A/lora_B),
only the adapter's parameters require gradients, so the optimizer, DDP and FSDP2 see only them.
The KL reference is the same model with the adapter switched off (`PeftModel.disable_adapter`):
no second copy of the weights. Weight sync, checkpoints and export move the adapter alone, under
PEFT's own names and config (what `PeftModel.save_pretrained` writes and vLLM's LoRA loader
reads; grpojob.sync.adapter): `adapter_model.safetensors` + `adapter_config.json`.
"""
from __future__ import annotations

import enum
import json
from typing import Any, Optional

import torch
from torch import Tensor, nn

from grpojob.learner.errors import TrainerError
from grpojob.api.lora import OUTPUT_LAYER, LoraSpec, output_layer_problems
from grpojob.sync.stream import TensorStream


def attach(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """A PeftModel around `model`, whose modules get the adapter in place (before any wrapping)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=spec.peft_target_modules(), task_type="CAUSAL_LM")
    # The validator's own rule (grpojob.api.lora), on this model's output layer by its real name.
    head = model.get_output_embeddings()
    head_name = next((name for name, m in model.named_modules() if m is head), OUTPUT_LAYER)
    for _, why in output_layer_problems(spec.target_modules, head_name):
        raise TrainerError(f"spec.model.lora.targetModules: {why}")
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:  # e.g. target modules not found in the model
        raise TrainerError(f"spec.model.lora.targetModules: {e}") from e
    return peft_model


def config_json(peft_model: nn.Module) -> dict[str, Any]:
    """The adapter's PEFT config as adapter_config.json holds it (targets resolved by PEFT)."""
    def plain(v: Any) -> Any:
        if isinstance(v, (set, frozenset, tuple)):
            return sorted(v) if isinstance(v, (set, frozenset)) else list(v)
        if isinstance(v, enum.Enum):
            return v.value
        return v

    cfg = peft_model.peft_config[peft_model.active_adapter]
    return json.loads(json.dumps({k: plain(v) for k, v in cfg.to_dict().items()}, default=str))


class AdapterOff(nn.Module):
    """The KL reference: the policy's module with the adapter disabled while it runs. It calls
    the unwrapped module (no DDP hooks: reference log-probs take no gradient); under FSDP2 the
    call gathers parameters like the policy's own forward (collective, as compute_logprobs says)."""

    def __init__(self, peft_model: nn.Module, inner: nn.Module):
        super().__init__()
        self._peft = [peft_model]  # not a submodule: its parameters belong to the policy
        self._inner = [inner]

    def forward(self, *args, **kwargs):
        with self._peft[0].disable_adapter():
            return self._inner[0](*args, **kwargs)


def state(peft_model: nn.Module) -> dict[str, Tensor]:
    """The adapter's tensors under PEFT's saved names (base_model.model.<module>.lora_A.weight);
    DTensor shards under FSDP2."""
    from peft import get_peft_model_state_dict

    # The base never changes: never the embedding layers' own weights (PEFT adds them when
    # lm_head or embed_tokens is a target), only the adapter.
    return get_peft_model_state_dict(peft_model, save_embedding_layers=False)


def stream(peft_model: nn.Module, dtype: Optional[torch.dtype] = None) -> TensorStream:
    """The adapter as a TensorStream carrying its config (`stream.adapter`): what a LoRA trainer
    pushes. Each tensor is gathered from its shards when taken (collective, like weight_stream)."""
    return TensorStream.gathered(state(peft_model), dtype, adapter=config_json(peft_model))
