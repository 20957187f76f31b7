"""The hf engine's attention: KV slots that live outside transformers, read by an attention
function registered through transformers' public `AttentionInterface`.

The decoder gives transformers no cache (use_cache=False). Each forward carries a `Step` as the
model keyword `grpojob_kv` (transformers passes model keywords down to the attention function,
see its "Attention Interface" docs) and its own 4D mask as `attention_mask` (a 4D mask is used
as given: transformers builds none). `forward` writes the layer's new keys and values into
`Slots` (buffers keyed by the attention module, shaped from the keys it first sees) and attends:
- prefill: one packed row of prompts (block-diagonal causal mask) over its own new keys;
- decode: row a is slot a at its own position, attending over its slot up to `kv_len`. With one
  query per row, the query heads sharing a KV head become that head's queries, so grouped KV
  heads (Qwen2: 7 query heads per KV head) are read in place, never repeated into a copy, on
  any device and with a mask (CUDA's fused kernels take GQA only without one).
Without `grpojob_kv` (an ordinary forward: transformers' generate, a reference computation)
the model runs transformers' own sdpa attention and mask, so installing this keeps the model
usable as it was.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn

NAME = "grpojob_slots"  # the attention implementation registered in transformers
KWARG = "grpojob_kv"  # the model keyword that carries a Step


class Unsupported(NotImplementedError):
    """An attention layer asks for something this attention does not do."""


class Slots:
    """KV buffers [slots, kv_heads, max_len, head_dim] of every attention module of one model."""

    def __init__(self, slots: int, max_len: int):
        self.slots, self.max_len = slots, max_len
        self.kv: dict[nn.Module, tuple[Tensor, Tensor]] = {}

    def buffers(self, module: nn.Module, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        kv = self.kv.get(module)
        if kv is None:
            kv = self.kv[module] = (key.new_zeros(self.slots, key.shape[1], self.max_len, key.shape[3]),
                                    value.new_zeros(self.slots, value.shape[1], self.max_len, value.shape[3]))
        return kv

    def copy(self, src: int, dst, length: int) -> None:
        self.copy_many([src] * len(dst), list(dst), length)

    def copy_many(self, src: list[int], dst: list[int], length: int) -> None:
        """Positions [0, length) of slot src[i] into slot dst[i], for every i at once: two kernels a
        buffer (one gather, one scatter), where a copy per group and buffer (each building its index
        on the host) made hundreds of launches of a prefill (16 prompts x 24 layers x K and V).
        Positions past a row's own length are never read (its mask hides them), so groups of
        different prompt lengths share the longest."""
        if not dst or not self.kv:
            return
        device = next(iter(self.kv.values()))[0].device
        s, d = torch.tensor(src, device=device), torch.tensor(dst, device=device)
        for buf in (b for kv in self.kv.values() for b in kv):
            buf[d, :, :length] = buf[s, :, :length]


@dataclass
class Step:
    """One forward: where its new keys go, and what each query sees. Prefill (`slot` given): a
    packed row [1, T], token t to slot[t] at position pos[t], `mask` [1, 1, T, T]. Decode: rows
    [R, 1], row a to slot a at pos[a], `mask` [R, 1, 1, kv_len]."""
    slots: Slots
    pos: Tensor
    mask: Tensor
    slot: Optional[Tensor] = None
    kv_len: int = 0
    _windowed: dict = field(default_factory=dict, init=False, repr=False)

    def mask_for(self, window: Optional[int]) -> Tensor:
        """The mask of a layer that sees only the last `window` positions (transformers: a query
        at p sees keys at p - window < k <= p); computed once per forward for all such layers."""
        if window is None:
            return self.mask
        if window not in self._windowed:
            if self.slot is not None:
                near = (self.pos[:, None] - self.pos[None, :]) < window
            else:
                near = torch.arange(self.kv_len, device=self.pos.device)[None, :] > self.pos[:, None] - window
                near = near[:, None, None]
            self._windowed[window] = self.mask & near
        return self._windowed[window]


def install(model) -> None:
    """Point a transformers model at this attention (its ordinary forwards keep sdpa)."""
    _register()
    model.set_attn_implementation(NAME)


@functools.lru_cache(maxsize=None)
def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(NAME, forward)
    # ordinary forwards get the mask sdpa gets; the decoder's forwards bring their own 4D mask
    AttentionMaskInterface.register(NAME, AttentionMaskInterface()["sdpa"])


def forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
            **kwargs) -> tuple[Tensor, None]:
    """transformers' attention signature: q [B, Hq, L, D], k/v [B, Hkv, L, D] -> [B, L, Hq, D]."""
    step: Optional[Step] = kwargs.pop(KWARG, None)
    if step is None:
        from transformers import AttentionInterface

        return AttentionInterface()["sdpa"](module, query, key, value, attention_mask, **kwargs)
    if module not in step.slots.kv:  # a layer's keywords are the same at every call: check once
        _check(module, kwargs)
    k_buf, v_buf = step.slots.buffers(module, key, value)
    mask, scale = step.mask_for(kwargs.get("sliding_window")), kwargs.get("scaling")
    if step.slot is not None:  # prefill: [1, H, T, D]
        k_buf[step.slot, :, step.pos] = key[0].transpose(0, 1)
        v_buf[step.slot, :, step.pos] = value[0].transpose(0, 1)
        return _grouped_sdpa(query, key, value, mask, scale).transpose(1, 2).contiguous(), None
    rows, heads, _, dim = query.shape  # decode: [R, H, 1, D]
    at = torch.arange(rows, device=key.device)
    k_buf[at, :, step.pos] = key[:, :, 0]
    v_buf[at, :, step.pos] = value[:, :, 0]
    keys, values = k_buf[:rows, :, :step.kv_len], v_buf[:rows, :, :step.kv_len]
    q = query.reshape(rows, keys.shape[1], heads // keys.shape[1], dim)  # query head h reads KV head h // group
    out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(rows, 1, heads, dim), None


def _grouped_sdpa(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: Optional[float]) -> Tensor:
    group = query.shape[1] // key.shape[1]
    if group > 1 and query.device.type != "cpu":  # CUDA's kernels that take a mask take no GQA
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                            enable_gqa=key.shape[1] != query.shape[1])


def _check(module: nn.Module, kwargs: dict) -> None:
    """Refuse what a layer asks of its attention function that this one would silently drop."""
    why = None
    if kwargs.get("dropout"):
        why = "attention dropout (the model is in training mode)"
    elif kwargs.get("softcap") is not None:
        why = f"attention logit soft-capping (softcap={kwargs['softcap']})"
    elif kwargs.get("is_causal", True) is False:
        why = "bidirectional attention (is_causal=False)"
    else:
        extra = sorted(k for k, v in kwargs.items() if isinstance(v, Tensor) and k != "position_ids")
        if extra:
            why = f"extra attention inputs {extra}"
    if why:
        raise Unsupported(f"{type(module).__name__} asks for {why}, which the hf engine's attention does not do")
