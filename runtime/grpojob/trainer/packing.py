"""Sequence packing: completions (prompt + completion, no padding between them) laid into rows,
rows into token-budget micro-batches.

A row holds several sequences back to back with position ids restarting at 0 for each; rows are
at most ROW_TOKENS long (or the longest sequence). Rows, not one long row per micro-batch,
because attention over a row costs O(length^2) even with the block-diagonal mask: measured on
CPU, 256-token rows ran about 3x faster than one 2k-token row and 1.3x faster than padding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

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

    @property
    def n_inputs(self) -> int:  # the last token is only ever a target
        return len(self.prompt_ids) + len(self.completion_ids) - 1

    @property
    def n_trained(self) -> int:
        return int(sum(self.loss_mask))


@dataclass
class MicroBatch:
    input_ids: Tensor  # [R, L]
    position_ids: Tensor  # [R, L]
    token_index: Tensor  # [N] flat positions in R*L that predict a trained token
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

    @property
    def n_seqs(self) -> int:
        return len(self.seqs) or 1  # a dummy micro-batch has one pseudo-sequence

    @property
    def is_dummy(self) -> bool:
        return bool(self.extra.get("dummy"))


def plan(lengths: Sequence[int], budget: int, row_tokens: int = ROW_TOKENS) -> list[list[list[int]]]:
    """Micro-batches -> rows -> sequence indices. First-fit decreasing into rows of capacity
    max(row_tokens, longest) (capped by the budget), then as many rows per micro-batch as fit in
    `budget` tokens. Deterministic (ties keep input order)."""
    if not lengths:
        return []
    longest = max(lengths)
    if longest > budget:
        raise ValueError(f"a sequence of {longest} tokens does not fit training.microBatchTokens ({budget})")
    cap = min(budget, max(row_tokens, longest))
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


def build(seqs: Sequence[TrainSeq], layout: list[list[int]], pad_id: int = 0) -> MicroBatch:
    """Tensors of one micro-batch from its rows of sequence indices."""
    width = max(sum(seqs[i].n_inputs for i in row) for row in layout)
    ids = torch.full((len(layout), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(layout), width), dtype=torch.long)
    token_index, targets, seq_index, adv, coef, rlp, order = [], [], [], [], [], [], []
    for r, row in enumerate(layout):
        at = 0
        for i in row:
            s = seqs[i]
            tokens = s.prompt_ids + s.completion_ids
            n = len(tokens) - 1
            ids[r, at:at + n] = torch.tensor(tokens[:-1])
            pos[r, at:at + n] = torch.arange(n)
            local = len(order)
            order.append(i)
            first = at + len(s.prompt_ids) - 1  # input position that predicts completion token 0
            for j, (tok, m) in enumerate(zip(s.completion_ids, s.loss_mask)):
                if m:
                    token_index.append(r * width + first + j)
                    targets.append(tok)
                    seq_index.append(local)
                    adv.append(s.advantage)
                    coef.append(s.coef)
                    rlp.append(s.rollout_logprobs[j])
            at += n
        if at < width:  # tail padding: its own pseudo-sequence, after (so invisible to) real tokens
            pos[r, at:] = torch.arange(width - at)
    return MicroBatch(
        input_ids=ids, position_ids=pos, token_index=torch.tensor(token_index, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long), seq_index=torch.tensor(seq_index, dtype=torch.long),
        advantages=torch.tensor(adv, dtype=torch.float32), coef=torch.tensor(coef, dtype=torch.float32),
        rollout_logp=torch.tensor(rlp, dtype=torch.float32), seqs=order,
        n_tokens=sum(seqs[i].n_inputs for row in layout for i in row))


def pack(seqs: Sequence[TrainSeq], budget: int, row_tokens: int = ROW_TOKENS, pad_id: int = 0) -> list[MicroBatch]:
    return [build(seqs, mb, pad_id) for mb in plan([s.n_inputs for s in seqs], budget, row_tokens)]


def dummy(pad_id: int = 0) -> MicroBatch:
    """A one-token micro-batch that trains nothing: ranks with fewer micro-batches run these so
    every rank makes the same collective calls (DDP / FSDP) in the same order."""
    z = torch.zeros(1, dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 1), pad_id, dtype=torch.long), position_ids=torch.zeros((1, 1), dtype=torch.long),
                      token_index=torch.zeros(1, dtype=torch.long), targets=torch.full((1,), pad_id, dtype=torch.long),
                      seq_index=torch.zeros(1, dtype=torch.long), advantages=z, coef=z.clone(),
                      rollout_logp=z.clone(), seqs=[], n_tokens=0, extra={"dummy": True})
