"""Sequence packing: the step's completions laid into rows without padding between them, rows
into token-budget micro-batches.

Shared prompts: the completions of one group share their prompt, so a group is packed as ONE
unit `prompt, completion 1, completion 2, ...`: the prompt is computed once, each completion
attends to the prompt and to its own earlier tokens only (a block mask), and its position ids
continue from the prompt's. With G completions this saves (G-1) prompt copies of compute per
group, exactly (the prompt's hidden states are the same in every copy). A group too long for a
row is split into several units, each with its own copy of the prompt.

Rows are at most ROW_TOKENS long (or the longest unit): attention over a row costs O(length^2)
even under the mask; measured on CPU, 256-token rows ran about 3x faster than one 2k-token row
and 1.3x faster than padding.
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
    attention_mask: Tensor  # [R, 1, L, L] bool: True where a query may attend to a key
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


def build(seqs: Sequence[TrainSeq], layout: list[list[list[int]]], pad_id: int = 0) -> MicroBatch:
    """Tensors of one micro-batch from its rows of units (lists of sequence indices)."""
    width = max(sum(unit_length(seqs, u) for u in row) for row in layout)
    n_rows = len(layout)
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    block = torch.zeros((n_rows, width), dtype=torch.long)  # unit id per position (-1-r padding)
    seg = torch.zeros((n_rows, width), dtype=torch.long)  # 0 prompt, j completion j (1-based)
    token_index, targets, seq_index, adv, coef, rlp, order, tpos = [], [], [], [], [], [], [], []
    names = sorted(set().union(*(seqs[i].fields for row in layout for u in row for i in u)))
    values: dict[str, list[float]] = {k: [] for k in names}
    n_tokens = 0
    for r, row in enumerate(layout):
        at = 0
        for u, unit in enumerate(row):
            prompt = seqs[unit[0]].prompt_ids
            p = len(prompt)
            ids[r, at:at + p] = torch.tensor(prompt)
            pos[r, at:at + p] = torch.arange(p)
            block[r, at:at + p] = u
            last_prompt = r * width + at + p - 1
            at += p
            for j, i in enumerate(unit, start=1):
                s = seqs[i]
                n = _completion_inputs(s)
                if n:
                    ids[r, at:at + n] = torch.tensor(s.completion_ids[:-1])
                    pos[r, at:at + n] = torch.arange(p, p + n)
                    block[r, at:at + n] = u
                    seg[r, at:at + n] = j
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
        if at < width:  # tail padding: its own block, attending only to itself
            pos[r, at:] = torch.arange(width - at)
            block[r, at:] = -1
    q = torch.arange(width)
    causal = q[:, None] >= q[None, :]
    same_block = block[:, :, None] == block[:, None, :]
    visible = (seg[:, None, :] == 0) | (seg[:, :, None] == seg[:, None, :])  # the prompt, or my own segment
    mask = (causal[None] & same_block & visible)[:, None]
    return MicroBatch(
        input_ids=ids, position_ids=pos, attention_mask=mask,
        token_index=torch.tensor(token_index, dtype=torch.long), targets=torch.tensor(targets, dtype=torch.long),
        seq_index=torch.tensor(seq_index, dtype=torch.long), advantages=torch.tensor(adv, dtype=torch.float32),
        coef=torch.tensor(coef, dtype=torch.float32), rollout_logp=torch.tensor(rlp, dtype=torch.float32),
        seqs=order, n_tokens=n_tokens, token_pos=torch.tensor(tpos, dtype=torch.long),
        fields={k: torch.tensor(v, dtype=torch.float32) for k, v in values.items()})


def pack(seqs: Sequence[TrainSeq], budget: int, row_tokens: int = ROW_TOKENS, pad_id: int = 0,
         share_prompts: bool = True) -> list[MicroBatch]:
    """Micro-batches holding every sequence once. share_prompts=False packs each sequence alone
    (prompt and completion), as a reference."""
    if not seqs:
        return []
    longest = max(s.n_inputs for s in seqs)
    if longest > budget:
        raise ValueError(f"a sequence of {longest} tokens does not fit training.microBatchTokens ({budget})")
    cap = row_capacity(longest, budget, row_tokens)
    groups = units(seqs, cap) if share_prompts else [[i] for i in range(len(seqs))]
    lengths = [unit_length(seqs, u) for u in groups]
    return [build(seqs, [[groups[k] for k in row] for row in mb], pad_id) for mb in plan(lengths, budget, row_tokens)]


def dummy(pad_id: int = 0) -> MicroBatch:
    """A one-token micro-batch that trains nothing: ranks with fewer micro-batches run these so
    every rank makes the same collective calls (DDP / FSDP) in the same order."""
    z = torch.zeros(1, dtype=torch.float32)
    return MicroBatch(input_ids=torch.full((1, 1), pad_id, dtype=torch.long),
                      position_ids=torch.zeros((1, 1), dtype=torch.long),
                      attention_mask=torch.ones((1, 1, 1, 1), dtype=torch.bool),
                      token_index=torch.zeros(1, dtype=torch.long), targets=torch.full((1,), pad_id, dtype=torch.long),
                      seq_index=torch.zeros(1, dtype=torch.long), advantages=z, coef=z.clone(),
                      rollout_logp=z.clone(), seqs=[], n_tokens=0, extra={"dummy": True},
                      token_pos=torch.zeros(1, dtype=torch.long))
