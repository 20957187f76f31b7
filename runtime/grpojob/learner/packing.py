"""Sequence packing: the step's completions laid into rows without padding between them, rows
into token-budget micro-batches.

Shared prompts: the completions of one group share their prompt, so a group is packed as ONE
unit `prompt, completion 1, completion 2, ...`: the prompt is computed once, each completion
attends to the prompt and to its own earlier tokens only, and its position ids continue from the
prompt's. With G completions this saves (G-1) prompt copies of compute per group, exactly (the
prompt's hidden states are the same in every copy). A group too long for a row is split into
several units, each with its own copy of the prompt.

What a token may attend to is kept as spans (`MicroBatch.spans`): every position of a row belongs
to exactly one span (a unit's prompt, one completion, or tail padding), and a span's tokens see
their span's earlier tokens plus an optional prefix span (a completion's prompt). The attention
backends (learner.attention) turn spans into a dense mask, a flex BlockMask or batched segments.

Row length is the device's choice (learner.sizing): short rows for a dense O(length^2) mask,
one row per micro-batch for the backends whose cost follows the spans. `bucket` rounds row counts
up to powers of two and row widths up to a multiple of BUCKET_MIN (one flex attention tile): the
layers and flex attention are compiled for dynamic widths (learner.attention), so a width needs no
power of two (which split the 0.5B benchmark's 8.6k-token step into micro-batches 8,192 and 1,024
wide: one 8,704 wide now).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from grpojob.learner import attention
from grpojob.learner.spans import BUCKET_MIN, dense_mask

ROW_TOKENS = 256


@dataclass
class TrainSeq:
    """One completion as the trainer sees it."""
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]  # per completion token: 1 = trained
    rollout_logprobs: list[float]  # per completion token
    advantage: float
    policy_version: int = 0
    coef: float = 0.0  # aggregation weight of each of its tokens (set once global counts are known)
    reward: float = 0.0  # the completion's shaped reward
    group: int = -1  # index of its group in the step's groups on this rank
    # Per completion token, set by a trainer's prepare_batch: advantages (instead of `advantage`)
    # and named values its loss_fn reads (MicroBatch.token_field).
    token_advantages: Optional[list[float]] = None
    fields: dict[str, list[float]] = field(default_factory=dict)

    def advantage_at(self, k: int) -> float:
        return self.token_advantages[k] if self.token_advantages is not None else self.advantage

    @property
    def has_signal(self) -> bool:
        """Some trained token has a non-zero advantage."""
        if self.token_advantages is None:
            return self.advantage != 0.0
        return any(a != 0.0 for a, m in zip(self.token_advantages, self.loss_mask) if m)

    @property
    def n_inputs(self) -> int:  # alone: the last token is only ever a target
        return len(self.prompt_ids) + len(self.completion_ids) - 1

    @property
    def n_trained(self) -> int:
        return int(sum(self.loss_mask))


@dataclass
class MicroBatch:
    input_ids: Tensor  # [R, L]
    position_ids: Tensor  # [R, L]
    spans: Tensor  # [S, 5] long: see ROW..LENGTH; they tile every row
    token_index: Tensor  # [N] flat positions in R*L whose next token is a trained token
    targets: Tensor  # [N]
    seq_index: Tensor  # [N] 0..n_seqs-1, into `seqs`
    advantages: Tensor  # [N]
    coef: Tensor  # [N] aggregation weights
    rollout_logp: Tensor  # [N]
    seqs: list[int]  # indices into the step's sequence list
    n_tokens: int  # real (non-padding) input tokens
    # Filled during training: pi_old per token (epoch 0) and the reference policy's log-probs.
    old_logp: Optional[Tensor] = None
    ref_logp: Optional[Tensor] = None
    extra: dict = field(default_factory=dict)
    token_pos: Optional[Tensor] = None  # [N] position of each token in its completion
    fields: dict[str, Tensor] = field(default_factory=dict)  # [N] each: TrainSeq.fields, packed

    def token_field(self, name: str) -> Tensor:
        """The per-token values [N] prepare_batch put in every sequence's `fields[name]` (zeros for
        a dummy micro-batch)."""
        if self.is_dummy:
            return torch.zeros(1, dtype=torch.float32)
        if name not in self.fields:
            raise KeyError(f"no per-token field '{name}': prepare_batch must set TrainSeq.fields['{name}'] "
                           f"on every sequence (it has {sorted(self.fields)})")
        return self.fields[name]

    @property
    def n_seqs(self) -> int:
        return len(self.seqs) or 1  # a dummy micro-batch has one pseudo-sequence

    @property
    def is_dummy(self) -> bool:
        return bool(self.extra.get("dummy"))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    @property
    def attention_mask(self) -> Tensor:
        """[R, 1, L, L] bool, True where a query may attend to a key (the dense form of `spans`)."""
        return dense_mask(self.spans, *self.shape)

    def attention(self, backend: str, device: torch.device):
        """What `backend` attention takes for this micro-batch, built once per device and reused
        (the reference model's pass and every epoch see the same layout)."""
        key = ("mask", backend, str(device))
        if key not in self.extra:
            self.extra[key] = attention.build(backend, self.spans.to(device), *self.shape)
        return self.extra[key]

    def inputs(self, device: torch.device, backend: str) -> dict:
        """Keyword arguments of PolicyLogprobs.forward for this micro-batch."""
        return dict(input_ids=self.input_ids.to(device), position_ids=self.position_ids.to(device),
                    attention_mask=self.attention(backend, device), token_index=self.token_index.to(device),
                    targets=self.targets.to(device))


def _completion_inputs(s: TrainSeq) -> int:
    return len(s.completion_ids) - 1  # its tokens that are inputs (the first is predicted by the prompt)


def units(seqs: Sequence[TrainSeq], cap: int) -> list[list[int]]:
    """Runs of consecutive sequences with the same prompt, split so each unit's length
    (prompt + completion inputs) stays within `cap`."""
    out: list[list[int]] = []
    length = 0
    for i, s in enumerate(seqs):
        need = _completion_inputs(s)
        if out and seqs[out[-1][0]].prompt_ids == s.prompt_ids and length + need <= cap:
            out[-1].append(i)
            length += need
        else:
            out.append([i])
            length = len(s.prompt_ids) + need
    return out


def unit_length(seqs: Sequence[TrainSeq], unit: list[int]) -> int:
    return len(seqs[unit[0]].prompt_ids) + sum(_completion_inputs(seqs[i]) for i in unit)


def plan(lengths: Sequence[int], budget: int, row_tokens: int = ROW_TOKENS) -> list[list[list[int]]]:
    """Micro-batches -> rows -> item indices. First-fit decreasing into rows of capacity
    max(row_tokens, longest) (capped by the budget), then as many rows per micro-batch as fit in
    `budget` tokens. Deterministic (ties keep input order)."""
    if not lengths:
        return []
    longest = max(lengths)
    if longest > budget:
        raise ValueError(f"a sequence of {longest} tokens does not fit training.microBatchTokens ({budget})")
    cap = row_capacity(longest, budget, row_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        for r, used in enumerate(fill):
            if used + lengths[i] <= cap:
                rows[r].append(i)
                fill[r] += lengths[i]
                break
        else:
            rows.append([i])
            fill.append(lengths[i])
    per_mb = max(1, budget // cap)
    return [rows[i:i + per_mb] for i in range(0, len(rows), per_mb)]


def row_capacity(longest: int, budget: int, row_tokens: int = ROW_TOKENS) -> int:
    return min(budget, max(row_tokens, longest))


def tile_width(n: int, tile: int = BUCKET_MIN) -> int:
    """n rounded up to a multiple of `tile`."""
    return -(-n // tile) * tile


def bucket_size(n: int, limit: int, smallest: int = 1) -> int:
    """The power of two times `smallest` at or above n, but at most max(n, limit)."""
    b = smallest
    while b < n:
        b *= 2
    return max(n, min(b, limit))


def build(seqs: Sequence[TrainSeq], layout: list[list[list[int]]], pad_id: int = 0,
          shape: Optional[tuple[int, int]] = None) -> MicroBatch:
    """Tensors of one micro-batch from its rows of units (lists of sequence indices). `shape`
    (rows, width) pads to a bucketed shape; padding rows and tail positions are spans of their own."""
    fills = [sum(unit_length(seqs, u) for u in row) for row in layout]
    n_rows, width = shape or (len(layout), max(fills))
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    spans: list[tuple[int, int, int, int, int]] = []
    token_index, targets, seq_index, adv, coef, rlp, order, tpos = [], [], [], [], [], [], [], []
    names = sorted(set().union(*(seqs[i].fields for row in layout for u in row for i in u)))
    values: dict[str, list[float]] = {k: [] for k in names}
    n_tokens = 0
    for r in range(n_rows):
        at = 0
        for unit in layout[r] if r < len(layout) else []:
            prompt = seqs[unit[0]].prompt_ids
            p = len(prompt)
            ids[r, at:at + p] = torch.tensor(prompt)
            pos[r, at:at + p] = torch.arange(p)
            prompt_at = at
            spans.append((r, at, 0, at, p))
            last_prompt = r * width + at + p - 1
            at += p
            for i in unit:
                s = seqs[i]
                n = _completion_inputs(s)
                if n:
                    ids[r, at:at + n] = torch.tensor(s.completion_ids[:-1])
                    pos[r, at:at + n] = torch.arange(p, p + n)
                    spans.append((r, prompt_at, p, at, n))
                local = len(order)
                order.append(i)
                for k, (tok, m) in enumerate(zip(s.completion_ids, s.loss_mask)):
                    if m:  # token k is predicted at the last prompt position (k=0) or after token k-1
                        token_index.append(last_prompt if k == 0 else r * width + at + k - 1)
                        targets.append(tok)
                        seq_index.append(local)
                        adv.append(s.advantage_at(k))
                        coef.append(s.coef)
                        rlp.append(s.rollout_logprobs[k])
                        tpos.append(k)
                        for name in names:
                            if name not in s.fields:
                                raise ValueError(f"TrainSeq.fields['{name}'] is set on some sequences, "
                                                 f"not on all")
                            values[name].append(float(s.fields[name][k]))
                at += n
        n_tokens += at
        if at < width:  # tail padding: a span of its own, attending only to itself
            pos[r, at:] = torch.arange(width - at)
            spans.append((r, at, 0, at, width - at))
    return MicroBatch(
        input_ids=ids, position_ids=pos, spans=torch.tensor(spans, dtype=torch.long),
        token_index=torch.tensor(token_index, dtype=torch.long), targets=torch.tensor(targets, dtype=torch.long),
        seq_index=torch.tensor(seq_index, dtype=torch.long), advantages=torch.tensor(adv, dtype=torch.float32),
        coef=torch.tensor(coef, dtype=torch.float32), rollout_logp=torch.tensor(rlp, dtype=torch.float32),
        seqs=order, n_tokens=n_tokens, token_pos=torch.tensor(tpos, dtype=torch.long),
        fields={k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()})


def pack(seqs: Sequence[TrainSeq], budget: int, row_tokens: int = ROW_TOKENS, pad_id: int = 0,
         share_prompts: bool = True, bucket: bool = False) -> list[MicroBatch]:
    """Micro-batches holding every sequence once. share_prompts=False packs each sequence alone
    (prompt and completion), as a reference. bucket: pad each micro-batch to (rows, width), rows
    rounded up to a power of two and the width to a multiple of BUCKET_MIN (at most the row capacity)."""
    if not seqs:
        return []
    longest = max(s.n_inputs for s in seqs)
    if longest > budget:
        raise ValueError(f"a sequence of {longest} tokens does not fit training.microBatchTokens ({budget})")
    cap = row_capacity(longest, budget, row_tokens)
    groups = units(seqs, cap) if share_prompts else [[i] for i in range(len(seqs))]
    lengths = [unit_length(seqs, u) for u in groups]
    out = []
    per_mb = max(1, budget // cap)
    for mb in plan(lengths, budget, row_tokens):
        layout = [[groups[k] for k in row] for row in mb]
        shape = None
        if bucket:
            width = max(sum(lengths[k] for k in row) for row in mb)
            shape = (bucket_size(len(mb), per_mb), max(width, min(tile_width(width), cap)))
        out.append(build(seqs, layout, pad_id, shape))
    return out


def dummy(pad_id: int = 0) -> MicroBatch:
    """A one-token micro-batch that trains nothing: ranks with fewer micro-batches run these so
    every rank makes the same collective calls (DDP / FSDP) in the same order."""
    z = torch.zeros(1, dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 1), pad_id, dtype=torch.long),
                      position_ids=torch.zeros((1, 1), dtype=torch.long),
                      spans=torch.tensor([[0, 0, 0, 0, 1]], dtype=torch.long),
                      token_index=torch.zeros(1, dtype=torch.long), targets=torch.full((1,), pad_id, dtype=torch.long),
                      seq_index=torch.zeros(1, dtype=torch.long), advantages=z, coef=z.clone(),
                      rollout_logp=z.clone(), seqs=[], n_tokens=0, extra={"dummy": True},
                      token_pos=torch.zeros(1, dtype=torch.long))
