"""Model FLOPs of a train step and the device's peak: the train stage's MFU.

Counted per trained token (a completion token under the loss), forward and backward, the usual
way (Kaplan et al., PaLM's appendix B): 6 FLOPs per weight of a matmul (forward 2, backward 4),
plus the attention's two matmuls (scores and values), 12 FLOPs per attended position per
attention channel per layer, a causal token at position p attending to p + 1 positions. Prompt
tokens, the reference model's forward and padding are not counted: the figure is a floor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import nn

# Dense bf16 tensor-core peaks (FLOP/s, datasheets, no sparsity), matched in this order against
# torch.cuda.get_device_name(): the PCIe and NVL H100s first (their clocks are lower than SXM's).
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
    ("A100", 312e12), ("L40S", 362e12))


def peak_bf16(device_name: str) -> Optional[float]:
    """The dense bf16 peak of a GPU by its name; None when it is not in the table (then no MFU)."""
    return next((v for k, v in PEAK_BF16 if k in device_name), None)


def device_peak(device: torch.device) -> Optional[float]:
    """The peak of the device the trainer runs on (None on a CPU or an unknown GPU)."""
    if device.type != "cuda":
        return None
    return peak_bf16(torch.cuda.get_device_name(device))


@dataclass(frozen=True)
class ModelFlops:
    matmul_params: int  # weights that multiply every trained token: the decoder's and the output layer's
    layers: int
    attention_width: int  # heads x head dimension (the query width)

    def sequence(self, prompt: int, completion: int) -> float:
        """Forward + backward FLOPs of one sequence's `completion` trained tokens after `prompt` ones."""
        # sum over positions p = prompt .. prompt + completion - 1 of (p + 1) attended positions
        attended = completion * prompt + completion * (completion + 1) / 2
        return 6.0 * self.matmul_params * completion + 12.0 * self.layers * self.attention_width * attended

    def total(self, lengths: Iterable[tuple[int, int]]) -> float:
        return sum(self.sequence(p, c) for p, c in lengths)


def model_flops(model: nn.Module) -> ModelFlops:
    """The counts for a Hugging Face causal LM: every parameter but the input embedding (a lookup,
    no matmul), unless the output layer shares it (tied: it is the head's matmul)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embed is not None and (head is None or getattr(head, "weight", None) is not embed.weight):
        total -= embed.weight.numel()
    # A config without these fields (a plug-in's own model): the attention term is left out.
    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None) or 0
    head_dim = getattr(cfg, "head_dim", None) or (getattr(cfg, "hidden_size", 0) // heads if heads else 0)
    return ModelFlops(matmul_params=total, layers=getattr(cfg, "num_hidden_layers", None) or 0,
                      attention_width=heads * head_dim)
