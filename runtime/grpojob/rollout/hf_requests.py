"""What the hf engine's callers hand its scheduler thread (hf_engine): generation requests,
weight swaps and sleep/wake turns, each answered through an event or a future of the caller's
event loop."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Optional

from .hf_generate import Row
from .types import SamplingParams


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


@dataclass
class Swap:
    named: list
    version: int
    weights: str
    applied: threading.Event = field(default_factory=threading.Event)
    error: Optional[BaseException] = None


@dataclass
class Turn:
    done: threading.Event = field(default_factory=threading.Event)
    result: dict = field(default_factory=dict)


def settle(future: asyncio.Future, result, error: Optional[BaseException]) -> None:
    if not future.done():
        future.set_exception(error) if error is not None else future.set_result(result)
