"""Log-probabilities of chosen tokens without a full log-softmax copy per token.

The decoder runs on the packed input; only the hidden states that predict a trained token go
through the output layer, in chunks: logp = logit[target] - logsumexp(logits). When a chunk's
logits would be large, the chunk is recomputed in backward (activation checkpointing) so
memory holds one chunk of [tokens, vocab] at a time instead of all of them.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 1024
# Above this many logits in a call, chunks are recomputed in backward (about 256 MB in float32).
RECOMPUTE_ELEMENTS = 1 << 26


def _chunk(head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, want_entropy: bool
           ) -> tuple[Tensor, Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if want_entropy:
        with torch.no_grad():  # a metric: H = lse - sum(p * z)
            z = logits.detach()
            ent = lse.detach() - (torch.softmax(z, dim=-1) * z).sum(-1)
    else:
        ent = logp.new_zeros(0)
    return logp, ent


def token_logprobs(head: nn.Module, hidden: Tensor, targets: Tensor, temperature: float = 1.0,
                   entropy: bool = False, chunk: int = CHUNK_TOKENS) -> tuple[Tensor, Optional[Tensor]]:
    """hidden [N, H] and targets [N] -> (log p(target) [N], entropy [N] or None), in float32."""
    n = hidden.shape[0]
    vocab = getattr(head, "out_features", None) or head.weight.shape[0]
    recompute = torch.is_grad_enabled() and hidden.requires_grad and n * vocab > RECOMPUTE_ELEMENTS
    logps, ents = [], []
    for i in range(0, n, chunk):
        args = (head, hidden[i:i + chunk], targets[i:i + chunk], temperature, entropy)
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args)
        logps.append(lp)
        ents.append(ent)
    if n == 0:
        return hidden.new_zeros(0, dtype=torch.float32), (hidden.new_zeros(0, dtype=torch.float32) if entropy else None)
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


class PolicyLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM: packed input -> log-probs of the trained tokens.

    This module (not the inner LM) is what DDP / FSDP wrap, so their forward hooks run."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        decoder = getattr(model, "base_model", None)
        if decoder is None or decoder is model or model.get_output_embeddings() is None:
            raise ValueError(f"model class {type(model).__name__} is not a decoder with an output layer "
                             f"(expected a *ForCausalLM with base_model and get_output_embeddings())")

    def forward(self, input_ids: Tensor, position_ids: Tensor, attention_mask: Optional[Tensor], token_index: Tensor,
                targets: Tensor, temperature: float = 1.0, entropy: bool = False) -> tuple[Tensor, Tensor]:
        """input_ids/position_ids [R, L]; attention_mask [R, 1, L, L] bool (True: may attend), or
        None for rows packed by position ids alone (transformers then derives the block-diagonal
        causal mask from ids restarting at 0); token_index [N] positions (flat over R*L) whose next
        token is targets [N]."""
        out = self.model.base_model(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                    use_cache=False)
        hidden = out.last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, token_index)
        logp, ent = token_logprobs(self.model.get_output_embeddings(), hidden, targets, temperature, entropy)
        return logp, (ent if ent is not None else logp.new_zeros(0))
