"""Attention over packed rows: which kernel runs, and what it is given.

A packed row is tiled by spans (see packing): a token sees the earlier tokens of its own span and
its span's prefix (a completion sees its unit's prompt). Three backends express that:

- sdpa: a dense [R, 1, L, L] bool mask into scaled_dot_product_attention. Its cost is O(L^2) per
  row whatever the mask hides, and on CUDA it picks a kernel per new shape (cuDNN for some): the
  numerical reference, and fine for short rows.
- segments (CPU): the spans are gathered into one batch of short sequences (queries: a span;
  keys: its prefix then its own tokens) and go through one SDPA call per layer, so the cost is
  that of attending within each completion and its prompt, with no padding between units and
  no O(L^2) mask, and rows can be as long as the micro-batch (no padding between rows either).
- flex (CUDA): torch's flex_attention with a BlockMask built from the spans. Tiles the mask hides
  are skipped, so the cost follows the visible (query, key) pairs; the Triton kernel and the mask's
  builder are compiled once for every width (dynamic shapes).

`install(model, backend)` points a transformers model at a backend; `build` makes what it takes
from a micro-batch's spans; PolicyLogprobs hands that to the model.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from grpojob.learner.spans import BUCKET_MIN, LENGTH, PREFIX_LEN, PREFIX_START, ROW, START, dense_mask, token_ranges

BACKENDS = ("sdpa", "segments", "flex")
FLEX = "grpojob_flex"  # names our attention functions are registered under in transformers
SEGMENTS = "grpojob_segments"


def install(model, backend: str) -> None:
    """Make `model` (a transformers PreTrainedModel) run `backend` attention."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend '{backend}' (use {', '.join(BACKENDS)})")
    _register()
    model.set_attn_implementation({"sdpa": "sdpa", "segments": SEGMENTS, "flex": FLEX}[backend])


def build(backend: str, spans: Tensor, rows: int, width: int):
    """The attention input of one micro-batch (on the spans' device)."""
    if backend == "flex":
        return flex_mask(spans, rows, width)
    if backend == "segments":
        return Segments.from_spans(spans, rows, width)
    return dense_mask(spans, rows, width)


def flex_mask(spans: Tensor, rows: int, width: int, compiled: Optional[bool] = None):
    """The spans' rule as a flex_attention BlockMask. `compiled` (default: on CUDA) builds it with
    the compiled builder, evaluated tile by tile instead of as a dense [R, L, L] grid, its tensors
    marked dynamic in the width (_compiled)."""
    from torch.nn.attention.flex_attention import create_block_mask

    own, p0, p1 = token_ranges(spans, rows, width)

    def mask_mod(b, h, q, kv):
        return ((kv >= own[b, q]) & (kv <= q)) | ((kv >= p0[b, q]) & (kv < p1[b, q]))

    device = spans.device
    if not (device.type == "cuda" if compiled is None else compiled):
        return create_block_mask(mask_mod, B=rows, H=None, Q_LEN=width, KV_LEN=width, device=device,
                                 BLOCK_SIZE=BUCKET_MIN)
    mask = _compiled("create_block_mask")(mask_mod, B=rows, H=None, Q_LEN=width, KV_LEN=width, device=device,
                                          BLOCK_SIZE=BUCKET_MIN)
    for name in _MASK_TENSORS:  # [B, H, q blocks(, kv blocks)]: the block counts follow the width
        t = getattr(mask, name, None)
        if t is not None:
            for dim in range(2, t.dim()):
                torch._dynamo.mark_dynamic(t, dim)
    return mask


_MASK_TENSORS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices")


@functools.lru_cache(maxsize=None)
def _compiled(name: str):
    """flex_attention or create_block_mask compiled once for every micro-batch width: dynamic shapes,
    and the BlockMask's tensors marked dynamic (flex_mask). Compiled for static shapes, each new
    width recompiled both, forward and backward: on an H200 the step whose packing chose a new
    width took 12.7 s instead of 0.9. (torch.compile of create_block_mask is what torch's
    deprecation of its `_compile` flag recommends.)"""
    from torch.nn.attention import flex_attention as fa

    return torch.compile(getattr(fa, name), dynamic=True)


@dataclass
class _Batch:
    q_index: Tensor  # [S, Q] row positions of the queries (a span's tokens, padded by repeating its last)
    k_index: Tensor  # [S, P + Q] its prefix padded to P, then its own tokens
    mask: Tensor  # [S, 1, Q, P + Q]


@dataclass
class Segments:
    """Spans as batches of short sequences, one SDPA call per batch: spans are grouped by length
    (powers of two) so that a long prompt does not pad every completion to its length. Queries,
    keys and values are gathered for all batches at once (`q_index`, `k_index`: the batches'
    indices concatenated), so backward scatters into one buffer per tensor instead of one per
    batch. `back[t]` is where row position t's output is in the batches' outputs, concatenated."""
    batches: list[_Batch]
    q_index: Tensor
    k_index: Tensor
    back: Tensor

    @classmethod
    def from_spans(cls, spans: Tensor, rows: int, width: int) -> "Segments":
        length = spans[:, LENGTH]
        bucket = torch.ceil(torch.log2(length.clamp(min=1).double())).long()
        batches, slots, offset = [], [], 0
        for b in torch.unique(bucket).tolist():
            sel = spans[bucket == b]
            batch, real = _batch(sel, width)
            batches.append(batch)
            slots.append((batch.q_index.reshape(-1)[real], offset + real.nonzero().squeeze(1)))
            offset += real.numel()
        back = torch.empty(rows * width, dtype=torch.long, device=spans.device)
        for positions, slot in slots:
            back[positions] = slot
        return cls(batches, torch.cat([b.q_index.reshape(-1) for b in batches]),
                   torch.cat([b.k_index.reshape(-1) for b in batches]), back)

    def attend(self, query: Tensor, key: Tensor, value: Tensor, scale: Optional[float]) -> Tensor:
        """q [R, Hq, L, D], k/v [R, Hkv, L, D] -> [R, L, Hq, D]."""
        rows, heads, width, dim = query.shape
        group = heads // key.shape[1]

        def gather(x: Tensor, index: Tensor, per_batch: list[Tensor]) -> tuple[Tensor, ...]:
            """[R, H, L, D] -> per batch [S, H, n, D] (views of one gathered [sum S*n, H, D])."""
            flat = x.transpose(1, 2).reshape(rows * width, x.shape[1], dim)  # a view for [R, L, H, D] memory
            parts = flat.index_select(0, index).split([i.numel() for i in per_batch])
            return tuple(p.view(*i.shape, x.shape[1], dim).transpose(1, 2) for p, i in zip(parts, per_batch))

        qs = gather(query, self.q_index, [b.q_index for b in self.batches])
        k_parts = [b.k_index for b in self.batches]
        ks, vs = gather(key, self.k_index, k_parts), gather(value, self.k_index, k_parts)
        outs = []
        for b, q, k, v in zip(self.batches, qs, ks, vs):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=b.mask, scale=scale,
                                                                 enable_gqa=group > 1)
            outs.append(o.transpose(1, 2).reshape(-1, heads, dim))
        out = torch.cat(outs).index_select(0, self.back)
        return out.view(rows, width, heads, dim)


def _batch(spans: Tensor, width: int) -> tuple[_Batch, Tensor]:
    """One batch of spans; also which of its [S * Q] query slots are real tokens."""
    device = spans.device
    base = spans[:, ROW] * width
    start, length = base + spans[:, START], spans[:, LENGTH]
    p_start, p_len = base + spans[:, PREFIX_START], spans[:, PREFIX_LEN]
    n_q, n_p = int(length.max()), int(p_len.max())
    qi = torch.arange(n_q, device=device)
    pi = torch.arange(n_p, device=device)
    q_index = start[:, None] + torch.minimum(qi[None], length[:, None] - 1)
    prefix = p_start[:, None] + torch.minimum(pi[None], (p_len[:, None] - 1).clamp(min=0))
    sees_prefix = (pi[None] < p_len[:, None])[:, None, :].expand(-1, n_q, -1)
    # padded query slots (qi >= length) still see one key, so their (unused) softmax is finite
    own = (qi[None, :, None] >= qi[None, None, :]) & (qi[None, None, :] < length[:, None, None])
    mask = torch.cat([sees_prefix, own.expand(len(spans), -1, -1)], dim=2)[:, None]
    real = (qi[None] < length[:, None]).reshape(-1)
    return _Batch(q_index, torch.cat([prefix, q_index], dim=1), mask), real


# ---- the functions transformers calls ---------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _register() -> None:
    # The registries of transformers' documented attention interface (docs: "Attention Interface");
    # the mask function is the one its flex backend uses, as that page's example takes sdpa_mask.
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flex_attention_mask

    AttentionInterface.register(FLEX, flex_forward)
    AttentionInterface.register(SEGMENTS, segments_forward)
    # A flex call without a mask (rows packed by position ids alone) gets transformers' own flex
    # mask. SEGMENTS has no mask function: its model calls get attention_mask=None and the layout
    # as the `segments` keyword (transformers passes model keywords down to attention).
    AttentionMaskInterface.register(FLEX, flex_attention_mask)


def flex_kernel(device_type: str):
    """flex_attention for layers that are not compiled: compiled on its own on CUDA (the fused
    Triton kernel; uncompiled flex_attention is a dense reference implementation)."""
    from torch.nn.attention.flex_attention import flex_attention

    return _compiled("flex_attention") if device_type == "cuda" else flex_attention


def _compute_dtype(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v in autocast's dtype where it is on, as SDPA casts them itself. Over float32 master
    weights, transformers' rotary embedding multiplies bf16 q and k by float32 cos/sin, so they
    reach attention as float32 beside a bf16 v; flex attention then ran in float32: on an H200, 32%
    of the train stage's device time (1.4 ms a layer forward, 1.8 ms backward, 8k tokens)."""
    device = query.device.type
    if not torch.is_autocast_enabled(device):
        return query, key, value
    dtype = torch.get_autocast_dtype(device)
    return query.to(dtype), key.to(dtype), value.to(dtype)


def _repeat_kv(x: Tensor, times: int) -> Tensor:
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, times, n, d).reshape(b, h * times, n, d)


def flex_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling: Optional[float] = None,
                 dropout: float = 0.0, **_) -> tuple[Tensor, None]:
    """transformers' attention signature: q [B, Hq, L, D], k/v [B, Hkv, L, D] -> ([B, L, Hq, D],
    no weights). `attention_mask` is a BlockMask (or None: causal)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if dropout:
        raise ValueError("the trainer's attention backends do no attention dropout")
    if attention_mask is not None and not isinstance(attention_mask, BlockMask):
        raise TypeError(f"the flex attention backend takes a BlockMask, got {type(attention_mask).__name__}")
    query, key, value = _compute_dtype(query, key, value)
    group = query.shape[1] // key.shape[1]
    gqa = group > 1
    if gqa and group & (group - 1):  # the kernel's GQA wants a power-of-two group (Qwen2.5-0.5B: 7)
        key, value, gqa = _repeat_kv(key, group), _repeat_kv(value, group), False
    kernel = flex_attention if torch.compiler.is_compiling() else flex_kernel(query.device.type)
    out = kernel(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


@torch.compiler.disable  # data-dependent gathers: compiled layers break their graph here
def segments_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask,
                     scaling: Optional[float] = None, dropout: float = 0.0, segments: Optional[Segments] = None,
                     **_) -> tuple[Tensor, None]:
    if dropout:
        raise ValueError("the trainer's attention backends do no attention dropout")
    if segments is None:
        raise TypeError("the segments attention backend needs the micro-batch layout (segments=...)")
    return segments.attend(query, key, value, scaling), None
