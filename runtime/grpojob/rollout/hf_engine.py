"""The `hf` engine: transformers generation, batched across concurrent requests (CPU, small runs).

Requests that arrive while a batch runs wait and go together into the next batch (those with the
same n and sampling parameters share one `generate` call). Weights are swapped between batches
under the model lock; a push is received before the lock is taken, so generation goes on during
the transfer.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from .. import devices
from ..api.spec import GRPOJobSpec
from ..sync import buckets as bk
from ..sync import files, placement
from ..sync.placement import Endpoint
from ..sync.protocol import DISK
from . import hf_generate
from .engine import torch_dtype_name
from .types import Completion, SamplingParams

log = logging.getLogger("grpojob.rollout")


@dataclass
class _Request:
    prompt_ids: list[int]
    n: int
    sampling: SamplingParams
    future: asyncio.Future


class HFEngine:
    backend = "hf"
    last_pause_seconds: Optional[float] = None  # generation stopped by the last weight load

    def __init__(self, spec: GRPOJobSpec, *, device: Optional[str] = None, max_batch: int = 256):
        self.spec = spec
        self.device = torch.device(device) if device else devices.default()
        self.max_batch = max_batch
        self.version, self.weights = 0, DISK
        self.model = None
        self.tokenizer = None
        self._lock = threading.Lock()  # the model: one batch or one weight load at a time
        self._queue: list[_Request] = []
        self._running = 0
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._receiver = None
        self._error: Optional[str] = None

    async def start(self) -> None:
        self.model, self.tokenizer = await asyncio.to_thread(self._load_model)
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._batcher(), name="hf-batcher")

    def _load_model(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        m = self.spec.model
        dtype = getattr(torch, torch_dtype_name(self.spec, self.device.type == "cuda"))
        model = AutoModelForCausalLM.from_pretrained(m.path, dtype=dtype,
                                                     trust_remote_code=m.trust_remote_code)
        model.to(self.device).eval()
        tok = AutoTokenizer.from_pretrained(m.tokenizer or m.path, trust_remote_code=m.trust_remote_code)
        self._params = dict(model.state_dict())
        # Names a push must cover: tied aliases (lm_head of tied embeddings) come along for free.
        self._required = {n for n, _ in bk.dedup_tied(self._params.items())}
        log.info("hf engine: loaded %s (%s, %s)", m.path, dtype, self.device)
        return model, tok

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def context_len(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(prompt_ids), n, sampling, fut))
        self._wake.set()
        return await fut

    def load_info(self) -> tuple[int, int]:
        return len(self._queue), self._running

    def errored(self) -> Optional[str]:
        return self._error

    async def _batcher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                first = self._queue[0]
                batch = [r for r in self._queue if (r.n, r.sampling) == (first.n, first.sampling)]
                batch = batch[:max(1, self.max_batch // first.n)]
                for r in batch:
                    self._queue.remove(r)
                batch = [r for r in batch if not r.future.done()]  # cancelled while waiting
                if not batch:
                    continue
                self._running = sum(r.n for r in batch)
                try:
                    groups = await asyncio.to_thread(self._run, batch)
                except Exception as e:  # bad request parameters reach every request of the batch
                    log.exception("hf engine: generation failed")
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(e)
                else:
                    for r, g in zip(batch, groups):
                        if not r.future.done():
                            r.future.set_result(g)
                finally:
                    self._running = 0

    def _run(self, batch: list[_Request]) -> list[list[Completion]]:
        first = batch[0]
        with self._lock:
            groups = hf_generate.generate(
                self.model, [r.prompt_ids for r in batch], first.n, first.sampling,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                else self.tokenizer.eos_token_id,
                policy_version=self.version, max_batch=self.max_batch)
        for g in groups:
            for c in g:
                c.text = self.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        return groups

    # ---- weight sink ----------------------------------------------------------------------------
    def endpoints(self) -> list[Endpoint]:
        return [placement.local(self.device)]

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None:
        from ..sync.receiver import PushReceiver

        rx = self._receiver
        if rx is None or rx.addr != store_addr or rx.instance != instance:
            rx = self._receiver = PushReceiver(store_addr, instance, self.device)
        self.load(rx.receive(cmd), cmd["version"], cmd["weights"])

    def load_dir(self, path: str, version: int, weights: str) -> None:
        self.load(files.iter_dir(path), version, weights)

    def load(self, named: Iterable[tuple[str, torch.Tensor]], version: int, weights: str) -> None:
        """Copy named tensors into the model and switch the version, atomically for generation."""
        named = list(named)
        unknown = [n for n, _ in named if n not in self._params]
        if unknown:
            raise ValueError(f"weights do not match the model {self.spec.model.path}: unknown tensors "
                             f"{unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
        missing = self._required - {n for n, _ in named}
        if missing:
            raise ValueError(f"weights version {version} lack tensors of the model: {sorted(missing)[:5]}")
        for n, t in named:
            if tuple(t.shape) != tuple(self._params[n].shape):
                raise ValueError(f"tensor {n}: shape {tuple(t.shape)} does not match the model's "
                                 f"{tuple(self._params[n].shape)}")
        with self._lock, torch.no_grad(), bk.host_copies([self._params[named[0][0]]] if named else []):
            t0 = time.perf_counter()  # generation waits for the lock from here on
            for n, t in named:
                self._params[n].copy_(t)
            self.version, self.weights = version, weights
            self.last_pause_seconds = time.perf_counter() - t0

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
