"""Token sampling for the hf engine: every row (one completion) with its own parameters, and
random numbers that depend only on (row key, token index).

A row's token is drawn by inverting its distribution's CDF (softmax(logits / temperature), after
top-k / top-p filtering) at one uniform u. The uniform comes from a counter-based hash of (row
key, token index), not from a stateful generator, so a row's tokens do not depend on which other
rows share the batch or on the batch order: completion i of a request seeded s always sees the
same u (row key = hash(s, i)). One uniform per row and a handful of passes over the vocabulary
(log-softmax, exp, cumulative sum) make it cheap at a real vocabulary: the Gumbel-max draw it
replaced hashed one number per vocabulary entry and took 40% of a CPU decode step of a 151,936-
entry model (benchmarks/generation.py).
"""
from __future__ import annotations

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _fmix(x: Tensor) -> Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding values in [0, 2^32): a bijection with
    full avalanche. Products may wrap in int64; their low 32 bits are exact."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def row_key(seed: int, index: int) -> int:
    """The noise key of completion `index` of a request seeded `seed` (any Python int)."""
    s = seed & ((1 << 64) - 1)
    x = _fmix(torch.tensor([(s & _M32) ^ 0x243F6A88], dtype=torch.long))
    x = _fmix(x ^ ((s >> 32) & _M32))
    return int(_fmix((x + (index & _M32) * _GOLDEN) & _M32))


def uniforms(keys: Tensor, steps: Tensor) -> Tensor:
    """[A] float32 in (0, 1): the uniform of token `steps[a]` of row a (keys/steps int64 [A])."""
    h = _fmix((keys ^ _fmix((steps * 0x85EBCA77) & _M32)) & _M32)
    h = _fmix(h ^ 0x632BE5AB)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def _filter(scaled: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """-inf outside each row's top-k (k <= 0: all) and its top-p nucleus (the smallest set of most
    likely tokens whose probability reaches p; the most likely token always stays)."""
    vocab = scaled.shape[1]
    ordered, order = scaled.sort(dim=1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    probs = torch.softmax(ordered, dim=1)
    before = probs.cumsum(1) - probs  # probability of the tokens ranked above
    keep = (rank < k[:, None]) & ((before < top_p[:, None]) | (rank == 0))
    out = torch.full_like(scaled, float("-inf"))
    return out.scatter(1, order, torch.where(keep, ordered, float("-inf")))


def sample(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, keys: Tensor, steps: Tensor
           ) -> tuple[Tensor, Tensor]:
    """`sample_rows`, deciding from the tensors whether any row filters (one host sync: for
    callers without the rows' parameters on the host)."""
    return sample_rows(logits, temperature, top_p, top_k, keys, steps,
                       filtered=bool(((top_p < 1.0) | (top_k > 0)).any()), greedy=bool((temperature <= 0).any()),
                       tempered=bool((temperature != 1.0).any()))


def flags(params) -> tuple[bool, bool, bool]:
    """(filtered, greedy, tempered) of `sample_rows` for rows of these SamplingParams."""
    filtered = greedy = tempered = False
    for p in params:
        filtered = filtered or p.top_p < 1.0 or p.top_k > 0
        greedy = greedy or p.temperature <= 0
        tempered = tempered or p.temperature != 1.0
    return filtered, greedy, tempered


def sample_rows(logits: Tensor, temperature: Tensor, top_p: Tensor, top_k: Tensor, keys: Tensor, steps: Tensor,
                filtered: bool, greedy: bool = True, tempered: bool = True) -> tuple[Tensor, Tensor]:
    """logits [A, V] (raw, float32) and per-row parameters [A] -> (tokens [A], log-probs [A]).
    temperature 0 is greedy. Log-probs are log softmax(logits / temperature) of the chosen token
    over the full vocabulary (temperature 1 when greedy): the Completion contract.

    No host sync and no data-dependent branch (a CUDA graph replays it): greedy rows and filtered
    rows are chosen per row with torch.where. The flags come from the rows' parameters, which the
    caller holds on the host: `filtered` whether any row filters (only then is the sorted filter
    computed), `greedy` whether any row is greedy, `tempered` whether any temperature differs
    from 1. A flag only skips work that would change no row, so a row's token does not depend
    on the other rows: a row that does not filter draws from its full distribution either way."""
    if greedy:
        is_greedy = temperature <= 0
        temperature = torch.where(is_greedy, torch.ones_like(temperature), temperature)
    # x / 1.0 is exact: untempered rows are unchanged
    logp = torch.log_softmax(logits / temperature[:, None] if tempered or greedy else logits, dim=1)
    probs = logp.exp()
    if filtered:
        narrowed = torch.softmax(_filter(logp, top_p, top_k), dim=1)
        probs = torch.where(((top_p < 1.0) | (top_k > 0))[:, None], narrowed, probs)
    cdf = probs.cumsum_(dim=1)
    # the first entry whose CDF reaches u (scaled by the row's total: float32 sums to about 1)
    target = uniforms(keys, steps) * cdf[:, -1]
    choice = torch.searchsorted(cdf, target[:, None]).squeeze(1).clamp_(max=logits.shape[1] - 1)
    if greedy:
        choice = torch.where(is_greedy, logits.argmax(dim=1), choice)
    return choice, logp.gather(1, choice[:, None]).squeeze(1)
