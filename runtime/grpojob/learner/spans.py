"""Spans: what each position of a packed row may attend to (learner.packing lays them out, the
attention backends in learner.attention read them). A span is one row of `spans` [S, 5]: its row,
its prefix's start and length (a completion's shared prompt), its own start and length."""
from __future__ import annotations

import torch
from torch import Tensor

BUCKET_MIN = 128  # smallest bucketed row width: one flex attention tile (its BLOCK_SIZE)

# spans columns: row, prefix start, prefix length, start, length (positions within the row)
ROW, PREFIX_START, PREFIX_LEN, START, LENGTH = range(5)


def token_ranges(spans: Tensor, rows: int, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per position [R, L]: its span's start, and its prefix's [start, end). A query at q sees keys
    k with start <= k <= q or prefix start <= k < prefix end."""
    order = torch.argsort(spans[:, ROW] * width + spans[:, START])
    sp = spans[order]
    lengths = sp[:, LENGTH]
    own = torch.repeat_interleave(sp[:, START], lengths).view(rows, width)
    p0 = torch.repeat_interleave(sp[:, PREFIX_START], lengths).view(rows, width)
    p1 = p0 + torch.repeat_interleave(sp[:, PREFIX_LEN], lengths).view(rows, width)
    return own, p0, p1


def dense_mask(spans: Tensor, rows: int, width: int) -> Tensor:
    own, p0, p1 = token_ranges(spans, rows, width)
    k = torch.arange(width, device=spans.device)
    q = k[:, None]
    mine = (k >= own[..., None]) & (k <= q)
    prefix = (k >= p0[..., None]) & (k < p1[..., None])
    return (mine | prefix)[:, None]
