"""What the hf engine's callers hand its scheduler thread (hf_engine): generation requests,
weight swaps and sleep/wake turns, each answered through an event or a future of the caller's
event loop."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from grpojob.rollout.hf_generate import Row
from grpojob.contracts.rollout import SamplingParams


@dataclass
class Request:
    prompt_ids: list[int]
    n: int
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    rows: list[Row] = field(default_factory=list)  # not yet admitted
    done: dict = field(default_factory=dict)  # completion index -> Row

    def cancelled(self) -> bool:
        return self.future.done()


# An idle engine's first request waits for those arriving with it: a trainer's step sends its prompts
# one by one, and each that misses the first prefill costs a prefill and a decode step of its own
# (8 prompts of SmolLM2 arrived as 20 + 12 rows: 1-2 s more of a 10 s generation on 2 busy cores).
GATHER_QUIET = 0.01  # seconds without a new request that end the wait
GATHER_MOST = 0.1


def gather(cond: threading.Condition, queue: list) -> None:
    """Holding `cond` (the scheduler, nothing generating): wait while requests keep arriving in
    `queue` (callers notify `cond`), until GATHER_QUIET passes without one or GATHER_MOST in all."""
    end, seen = time.monotonic() + GATHER_MOST, -1
    while len(queue) != seen and time.monotonic() < end:
        seen = len(queue)
        cond.wait(min(GATHER_QUIET, max(0.0, end - time.monotonic())))


def take(queue: list[Request], free: int) -> list[list[Row]]:
    """Rows to admit now from the queue's requests, grouped by request (one prefill per group),
    within `free` slots; requests fully taken (or cancelled) leave the queue."""
    groups = []
    while queue and free:
        req = queue[0]
        if req.cancelled():
            queue.pop(0)
            continue
        rows, req.rows = req.rows[:free], req.rows[free:]
        groups.append(rows)
        free -= len(rows)
        if not req.rows:
            queue.pop(0)
    return groups


@dataclass
class Swap:
    named: list
    version: int
    weights: str
    applied: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None
    # a delta push onto the weights the engine holds: only these are written (`delta.by_tensor`)
    changes: Optional[dict] = None


def write(params: dict, swap: Swap) -> int:
    """Write a swap's tensors into the model's parameters; returns the values written. A delta
    scatters its changed values into their parameters in place, where a whole push copies every
    parameter (the engine's generation waits meanwhile)."""
    if swap.changes is None:
        for name, t in swap.named:
            params[name].copy_(t)
        return sum(t.numel() for _, t in swap.named)
    whole, written = dict(swap.named), 0
    for name, change in swap.changes.items():
        p = params[name]
        if change is None or (not p.is_contiguous() and name in whole):
            p.copy_(whole[name])
            written += p.numel()
            continue
        pos, val = change
        flat = p.view(-1) if p.is_contiguous() else p.reshape(-1)  # reshape: a copy, written back below
        flat.index_copy_(0, pos.to(p.device), val.to(p.device, p.dtype))
        if not p.is_contiguous():
            p.copy_(flat.view(p.shape))
        written += len(pos)
    return written


@dataclass
class Turn:
    done: threading.Event = field(default_factory=threading.Event)
    result: dict = field(default_factory=dict)


def settle(future: asyncio.Future, result, error: Optional[BaseException]) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(result)


def check_swap(named: list, params: dict, required: set, version: int, model: str) -> None:
    """ValueError unless `named` covers exactly the model's tensors (`required`: all but tied
    twins), each in its shape."""
    unknown = [n for n, _ in named if n not in params]
    if unknown:
        raise ValueError(f"weights do not match the model {model}: unknown tensors "
                         f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    missing = required - {n for n, _ in named}
    if missing:
        raise ValueError(f"weights version {version} lack tensors of the model: {sorted(missing)[:5]}")
    for n, t in named:
        if tuple(t.shape) != tuple(params[n].shape):
            raise ValueError(f"tensor {n}: shape {tuple(t.shape)} does not match the model's "
                             f"{tuple(params[n].shape)}")


def delta_swap(path: str, params: dict, held: str, version: int) -> tuple[list, dict]:
    """A delta version's whole tensors and changes (grpojob.sync.files.read_delta), checked against
    the weights the engine holds (`held`: its weights id) and the model: ValueError unless it is
    taken against them, names known tensors, whole ones in their shapes, positions inside them."""
    from grpojob.sync import files

    delta = files.read_delta(path)
    if delta.base != held:
        raise ValueError(f"{path} is a delta against weights {delta.base}; the engine holds {held}")
    unknown = [n for n in delta.changes if n not in params]
    if unknown:
        raise ValueError(f"weights version {version}: the delta names tensors the model lacks: {unknown[:5]}")
    for n, change in delta.changes.items():
        if change is None:
            check_swap([(n, delta.whole[n])], {n: params[n]}, set(), version, "")
        elif len(change[0]) and not 0 <= int(change[0].min()) <= int(change[0].max()) < params[n].numel():
            raise ValueError(f"weights version {version}: the delta's positions of {n} lie outside its "
                             f"{params[n].numel()} values")
    return list(delta.whole.items()), delta.changes
