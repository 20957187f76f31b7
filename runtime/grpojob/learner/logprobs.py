"""Log-probabilities of chosen tokens without materialising [tokens, vocab] logits.

The decoder runs on the packed input; only the hidden states that predict a trained token go
through the output layer, and that layer is fused with the log-softmax (`linear_logprobs`): the
logits are computed in [token chunk, vocab chunk] tiles, reduced on the fly to logsumexp, the
target's logit and (optionally) the entropy, and recomputed tile by tile in backward, where the
gradient of log p(t) = z_t - logsumexp(z) is (onehot(t) - softmax(z)) / temperature. Peak memory
is one tile, whatever the vocabulary (Qwen's 151,936 tokens included); matmuls run in the
hidden states' dtype (bf16 under autocast), reductions in float32. When all the logits fit in one
tile (tokens x vocabulary within the tile: the tile bounds memory, the vocabulary chunk only the
tiled path's tile width), torch's log_softmax does the job instead, with no recompute in backward:
SmolLM2's 49,152-token head over 384 tokens took 0.64 s forward and backward compiled against
1.10 s tiled on 2 CPU cores.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
from torch import Tensor, nn

from grpojob.learner.attention import Segments
from grpojob.learner.sizing import TILE_ELEMENTS, TrainShape
VOCAB_CHUNK = 32768


def _tiles(n: int, vocab: int, tile: int, vocab_chunk: int) -> tuple[int, int]:
    vc = min(vocab, vocab_chunk)
    return max(1, min(n, tile // vc)), vc


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Optional[Tensor], targets: Tensor, temperature: float,
                want_entropy: bool, tile: int, vocab_chunk: int):
        n, vocab = hidden.shape[0], weight.shape[0]
        tc, vc = _tiles(n, vocab, tile, vocab_chunk)
        lse = hidden.new_empty(n, dtype=torch.float32)
        target_z = hidden.new_zeros(n, dtype=torch.float32)
        ent = hidden.new_empty(n if want_entropy else 0, dtype=torch.float32)
        for t0 in range(0, n, tc):
            h, tg = hidden[t0:t0 + tc], targets[t0:t0 + tc]
            m = h.new_full((h.shape[0],), float("-inf"), dtype=torch.float32)
            s = torch.zeros_like(m)
            sz = torch.zeros_like(m)  # sum exp(z - m) * z, for the entropy
            for v0 in range(0, vocab, vc):
                z = _logits(h, weight, bias, v0, vc, temperature)
                inside = (tg >= v0) & (tg < v0 + z.shape[1])
                picked = z.gather(1, (tg - v0).clamp(0, z.shape[1] - 1)[:, None]).squeeze(1)
                target_z[t0:t0 + tc] += torch.where(inside, picked, 0.0)
                new_m = torch.maximum(m, z.max(1).values)
                scale = torch.exp(m - new_m)
                e = torch.exp(z - new_m[:, None])
                s = s * scale + e.sum(1)
                if want_entropy:
                    sz = sz * scale + (e * z).sum(1)
                m = new_m
            lse[t0:t0 + tc] = m + torch.log(s)
            if want_entropy:
                ent[t0:t0 + tc] = lse[t0:t0 + tc] - sz / s
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.tiles = temperature, (tc, vc)
        ctx.mark_non_differentiable(ent)
        return target_z - lse, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, _grad_ent: Tensor):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        (tc, vc), temperature = ctx.tiles, ctx.temperature
        n, vocab = hidden.shape[0], weight.shape[0]
        want_h, want_w, want_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], \
            bias is not None and ctx.needs_input_grad[2]
        d_hidden = torch.zeros_like(hidden, dtype=torch.float32) if want_h else None
        d_weight = torch.zeros_like(weight, dtype=torch.float32) if want_w else None
        d_bias = torch.zeros_like(bias, dtype=torch.float32) if want_b else None
        g = grad_logp.float() / temperature
        for t0 in range(0, n, tc):
            h, tg, gt = hidden[t0:t0 + tc], targets[t0:t0 + tc], g[t0:t0 + tc]
            for v0 in range(0, vocab, vc):
                z = _logits(h, weight, bias, v0, vc, temperature)
                dz = torch.exp(z - lse[t0:t0 + tc, None]) * -gt[:, None]  # d logp / dz * g
                inside = (tg >= v0) & (tg < v0 + z.shape[1])
                rows = inside.nonzero().squeeze(1)
                dz[rows, tg[rows] - v0] += gt[rows]
                dz_c = dz.to(hidden.dtype)
                w = weight[v0:v0 + z.shape[1]]
                if want_h:
                    d_hidden[t0:t0 + tc] += (dz_c @ w.to(hidden.dtype)).float()
                if want_w:
                    d_weight[v0:v0 + z.shape[1]] += (dz_c.t() @ h).float()
                if want_b:
                    d_bias[v0:v0 + z.shape[1]] += dz.sum(0)
        return (d_hidden.to(hidden.dtype) if want_h else None, d_weight.to(weight.dtype) if want_w else None,
                d_bias.to(bias.dtype) if want_b else None, None, None, None, None, None)


def _logits(h: Tensor, weight: Tensor, bias: Optional[Tensor], v0: int, vc: int, temperature: float) -> Tensor:
    w = weight[v0:v0 + vc].to(h.dtype)
    z = h @ w.t()
    if bias is not None:
        z = z + bias[v0:v0 + vc].to(z.dtype)
    z = z.float()
    return z / temperature if temperature != 1.0 else z


def linear_logprobs(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], targets: Tensor,
                    temperature: float = 1.0, entropy: bool = False, tile: int = TILE_ELEMENTS,
                    vocab_chunk: int = VOCAB_CHUNK, compiled: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """log softmax(hidden @ weight.T + bias) / temperature)[targets] per row, float32 [N], and the
    entropy of each row's distribution (no gradient; a metric) when asked. `compiled`: the one-tile
    path runs compiled (inductor fuses the log-softmax, gather and entropy into a pass or two over
    the logits: 20% of the head's time at the benchmark's small shape on CPU)."""
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty.clone() if entropy else None)
    if hidden.shape[0] * weight.shape[0] <= tile:
        one_tile = _compiled_one_tile() if compiled else _one_tile
        return one_tile(hidden, weight, bias, targets, temperature, entropy)
    logp, ent = _LinearLogprobs.apply(hidden, weight, bias, targets, float(temperature), bool(entropy),
                                      int(tile), int(vocab_chunk))
    return logp, (ent if entropy else None)


def _one_tile(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], targets: Tensor, temperature: float,
              entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
    """All the logits fit in one tile: torch's own log_softmax and its fused backward (about 20 ms
    less than the tiled function per 4,096 x 2,048 tile on CPU; it keeps that tile for backward)."""
    logp_all = torch.log_softmax(_logits(hidden, weight, bias, 0, weight.shape[0], temperature), dim=-1)
    logp = logp_all.gather(1, targets[:, None]).squeeze(1)
    if not entropy:
        return logp, None
    with torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


@functools.lru_cache(maxsize=None)
def _compiled_one_tile():
    return torch.compile(_one_tile, dynamic=True)  # dynamic: the token count changes every micro-batch


def token_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float = 1.0,
                   entropy: bool = False, **tiles) -> tuple[Tensor, Optional[Tensor]]:
    """hidden [N, H] and targets [N] through the output layer `head` (an nn.Linear) ->
    (log p(target) [N], entropy [N] or None), in float32."""
    return linear_logprobs(hidden, head.weight, head.bias, targets, temperature, entropy, **tiles)


class PolicyLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM: packed input -> log-probs of the trained tokens.

    This module (not the inner LM) is what DDP / FSDP wrap, so their forward hooks run. `shape`
    (trainer.sizing) sets the model's attention backend, compiles its layers and gives the
    autocast dtype (bf16 compute over float32 master weights); without it the model runs as
    loaded, in its parameters' dtype."""

    def __init__(self, model: nn.Module, shape: Optional[TrainShape] = None):
        super().__init__()
        self.model = model
        decoder = getattr(model, "base_model", None)
        if decoder is None or decoder is model or model.get_output_embeddings() is None:
            raise ValueError(f"model class {type(model).__name__} is not a decoder with an output layer "
                             f"(expected a *ForCausalLM with base_model and get_output_embeddings())")
        self.compute_dtype = shape.compute_dtype if shape is not None else None
        self.compiled = shape is not None and shape.compile is not None
        self.tile = shape.head_tile if shape is not None else TILE_ELEMENTS
        if shape is not None:
            shape.prepare(model)

    def _autocast(self, device: torch.device):
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.compute_dtype)

    def forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask, token_index: Tensor,
                targets: Tensor, temperature: float = 1.0, entropy: bool = False) -> tuple[Tensor, Tensor]:
        """input_ids/position_ids [R, L]; attention_mask: what the model's attention backend takes
        for packed rows (trainer.attention: a [R, 1, L, L] bool tensor for sdpa, Segments, a
        flex BlockMask), or None for rows packed by position ids alone (transformers then derives the
        block-diagonal causal mask from ids restarting at 0); token_index [N] positions (flat over
        R*L) whose next token is targets [N]."""
        layout = {"segments": attention_mask} if isinstance(attention_mask, Segments) else \
            {"attention_mask": attention_mask}
        with self._autocast(input_ids.device):
            out = self.model.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **layout)
            hidden = out.last_hidden_state
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, token_index)
            if self.compute_dtype is not None:
                hidden = hidden.to(self.compute_dtype)
        # Outside autocast: the fused head casts its tiles itself and reduces in float32.
        logp, ent = token_logprobs(self.model.get_output_embeddings(), hidden, targets, temperature, entropy,
                                   tile=self.tile, compiled=self.compiled)
        return logp, (ent if ent is not None else logp.new_zeros(0))
