"""The hf engine's attention on CPU: scaled_dot_product_attention over the grouped KV heads.

transformers' `sdpa` attention repeats the KV heads of a grouped-query model (Qwen2: 7 query heads
per KV head) into a full copy whenever a mask is given, because CUDA's fused kernels take no mask
with GQA. The decoder always gives a mask (each slot's own length), so on CPU every decode step
copied every layer's whole KV cache: 15% of a generation at the benchmark's small shape. The CPU
kernel takes masks and grouped heads together (`enable_gqa`), so the copy goes; on other devices
this is transformers' sdpa unchanged.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

NAME = "grpojob_gqa_sdpa"


def install(model) -> None:
    """Point a transformers model that runs `sdpa` attention at this one (others are left alone)."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    _register()
    model.set_attn_implementation(NAME)


@functools.lru_cache(maxsize=None)
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks made as for sdpa


def forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
            dropout: float = 0.0, scaling: Optional[float] = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention signature: q [B, Hq, L, D], k/v [B, Hkv, S, D] -> [B, L, Hq, D]."""
    if query.device.type != "cpu" or attention_mask is None or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None
