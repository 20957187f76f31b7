"""The `hf` engine: transformers models, continuously batched (hf_generate.Decoder).

One scheduler thread owns the model. Between decode steps it admits waiting requests into free
slots (their rows join the running batch; an idle engine first gathers those arriving together:
hf_requests.gather), runs one decode step of every active row, and hands finished requests back
to the asyncio loop. Requests differ freely in n and sampling parameters.

Weight swaps (`load`, from the sync agent's thread or an in-process publisher) are applied by the
scheduler thread at a decode-step boundary, never in the middle of a forward:
- spec.algorithm.partialRollouts false: the swap waits for the rows in flight to finish (on the
  old weights, tagged with the old version); no request is admitted while it is pending; later
  requests run on the new weights.
- partialRollouts true: the swap lands at the next step boundary; the rows in flight get their KV
  cache recomputed with the new weights (prompt + tokens so far) and go on; each token keeps
  the version that produced it (`Completion.versions`).
`load` returns once the new weights are in use; `last_pause_seconds` is how long the last swap
stopped generation (weights copied, KV recomputed).

LoRA (spec.model.lora): a push carries only the adapter (`load_adapter`). The engine keeps a copy
of the base weight of every adapted layer (taken before its first merge) and swaps in
W_base + scale * B @ A (grpojob.sync.adapter.merged), computed on the caller's thread; layers
an earlier adapter touched and this one does not go back to their base.

Sleep (spec.placement colocated: the trainer trains on the same device meanwhile): `sleep` returns
once the scheduler stopped at a decode-step boundary and freed the KV slots; nothing is admitted
or decoded until `wake`, which gives the slots back (rows in flight get their KV recomputed and go
on). Requests that arrive meanwhile wait in the queue; weight swaps still land (the weights stay:
level 1, the only level here).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Iterable, Optional

import torch

from grpojob import devices
from grpojob.api.spec import GRPOJobSpec
from grpojob.sync import adapter as lora, buckets as bk, files, placement, tensorfiles
from grpojob.sync.placement import Endpoint
from grpojob.sync.protocol import DISK
from grpojob.sync.receiver import PushReceiver
from grpojob.rollout.engine import torch_dtype_name
from grpojob.rollout.hf_generate import Decoder, Row, noise_keys, request_rows
from grpojob.rollout.hf_requests import Request, Swap, Turn, check_swap, delta_swap, gather, settle, take, write
from grpojob.contracts.rollout import Completion, SamplingParams

log = logging.getLogger("grpojob.rollout")


class HFEngine:
    backend = "hf"
    sleep_mode = True  # sleep/wake (grpojob.rollout.engine.Engine): spec.placement colocated
    delta_files = True  # load_dir applies delta versions in place (backend checkpoint, weightSync.delta)
    last_pause_seconds: Optional[float] = None  # generation stopped by the last weight load

    def __init__(self, spec: GRPOJobSpec, *, device: Optional[str] = None, max_batch: int = 256):
        self.spec = spec
        self.device = torch.device(device) if device else devices.default()
        self.max_batch = max_batch
        self.partial = spec.algorithm.partial_rollouts
        self.version, self.weights = 0, DISK
        self.last_pause_seconds: Optional[float] = None
        self.last_swap_values: int = 0  # values the last swap wrote (a delta: only those that changed)
        self.model = None
        self.tokenizer = None
        self._decoder: Optional[Decoder] = None
        self._cond = threading.Condition()
        self._queue: list[Request] = []
        self._swaps: list[Swap] = []
        self._admitting: list[list[Row]] = []  # taken from the queue, not yet among the decoder's rows
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        self._receiver = None
        self._error: Optional[str] = None
        self._base: dict[str, torch.Tensor] = {}  # LoRA: base weights of the adapted layers
        self.decode_steps = 0  # decode steps run so far (a sleeping engine runs none)
        self._sleep: Optional[Turn] = None  # asked to sleep, answered once asleep
        self._wake: Optional[Turn] = None
        self.asleep = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loaded = loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(loop, loaded), name="hf-scheduler", daemon=True)
        self._thread.start()
        self.model, self.tokenizer = await loaded

    def _load_model(self):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        m = self.spec.model
        dtype = getattr(torch, torch_dtype_name(self.spec.model.dtype, self.device.type == "cuda"))
        model = AutoModelForCausalLM.from_pretrained(m.path, dtype=dtype, trust_remote_code=m.trust_remote_code)
        model.to(self.device).eval()
        tok = AutoTokenizer.from_pretrained(m.tokenizer or m.path, trust_remote_code=m.trust_remote_code)
        self._params = dict(model.state_dict())
        # Names a push must cover: tied aliases (lm_head of tied embeddings) come along for free.
        self._required = {n for n, _ in bk.dedup_tied(self._params.items())}
        limit = min(self.spec.context_length, int(getattr(model.config, "max_position_embeddings", 1 << 30)))
        self._decoder = Decoder(model, slots=self.max_batch, max_len=limit, eos_token_id=tok.eos_token_id)
        log.info("hf engine: loaded %s (%s, %s), %d slots x %d tokens", m.path, dtype, self.device,
                 self.max_batch, limit)
        return model, tok

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def context_len(self) -> int:
        return self._decoder.cache.max_len

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        if len(prompt_ids) >= self.context_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context "
                             f"({self.context_len} tokens)")
        loop = asyncio.get_running_loop()
        req = Request(list(prompt_ids), n, sampling, loop.create_future(), loop)
        req.rows = request_rows(req, req.prompt_ids, n, sampling, noise_keys(sampling, n, self._noise))
        with self._cond:
            if self._error:
                raise RuntimeError(self._error)
            self._queue.append(req)
            self._cond.notify_all()
        return await req.future

    def load_info(self) -> tuple[int, int]:
        with self._cond:
            return len(self._queue), len(self._decoder.rows) if self._decoder else 0

    def errored(self) -> Optional[str]:
        return self._error

    # ---- the scheduler thread ---------------------------------------------------------------
    def _run(self, loop: asyncio.AbstractEventLoop, loaded: asyncio.Future) -> None:
        """Load the model, then schedule. Both on this thread, so that it is the only thread of
        the process that runs multi-threaded torch ops on the CPU: once another thread has its own
        OpenMP team (a model loaded in an executor thread, say), libgomp sees more threads than
        cores, stops spinning between parallel regions, and every small op of a decode step pays
        for waking its team. Measured on 2 cores: 7,200 -> 17,000-22,000 tokens/s (tiny model),
        1,500 -> 3,000 (small). The same goes for a team that another thread keeps while it
        waits, and for ours while we wait (an in-process trainer's): each hands its workers back
        before waiting (devices.release_cpu_threads)."""
        try:
            result = self._load_model()
        except Exception as e:  # noqa: BLE001 - start() raises it
            loop.call_soon_threadsafe(settle, loaded, None, e)
            return
        loop.call_soon_threadsafe(settle, loaded, result, None)
        self._schedule()

    def _schedule(self) -> None:
        try:
            while True:
                with self._cond:
                    idle = False
                    while not (self._closed or self._swap_due() or self._turn_due() or
                               (not self.asleep and (self._admissible() or self._decoder.rows))):
                        if not idle:  # nothing to do: our OpenMP team would throttle the trainer's
                            devices.release_cpu_threads()
                            idle = True
                        self._cond.wait()
                    if self._closed:
                        return
                    turn = self._turn_due()
                if turn is not None:
                    self._take_turn(turn)
                    continue
                with self._cond:
                    swaps = list(self._swaps) if self._swaps and (self.partial or not self._decoder.rows) else []
                    if not (swaps or self._decoder.rows or self.asleep):  # idle: one prefill for what comes with it
                        gather(self._cond, self._queue)
                    admit = take(self._queue, self._decoder.free) if not (self._swaps or self.asleep or self._closed) else []
                if swaps:
                    self._swap(swaps)
                    continue
                self._finish(self._decoder.drop(lambda r: not r.request.cancelled()))
                if admit:
                    self._admitting = admit
                    self._admit(admit)
                    self._admitting = []
                if self.asleep:  # a swap woke the loop: no decoding until wake
                    continue
                self._finish(self._decoder.step(self.version))
                self.decode_steps += 1
        except Exception as e:  # the model broke: every caller hears it, the server reports it
            log.exception("hf engine: the scheduler failed")
            self._fail(f"hf engine failed: {type(e).__name__}: {e}")

    def _swap_due(self) -> bool:
        """A swap can land now: not while rows it must wait for are parked by a sleep."""
        return bool(self._swaps) and not (self.asleep and self._decoder.rows and not self.partial)

    def _admissible(self) -> bool:
        return bool(self._queue) and not self._swaps and not self.asleep and self._decoder.free > 0

    # ---- sleep and wake (the scheduler thread applies them between decode steps) ----------------
    def _turn_due(self) -> Optional[Turn]:
        if self._sleep is not None and not self.asleep:
            return self._sleep
        if self._wake is not None and self.asleep:
            return self._wake
        return None

    def _take_turn(self, turn: Turn) -> None:
        start, sleeping = time.perf_counter(), turn is self._sleep
        if sleeping:
            turn.result = {"freed_bytes": self._decoder.release(), "parked_rows": len(self._decoder.rows)}
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the freed slots go back to the device, not to torch's cache
        else:
            self._decoder.restore()
        turn.result.update(seconds=time.perf_counter() - start, decode_steps=self.decode_steps)
        with self._cond:
            self.asleep = sleeping
            self._sleep = self._wake = None
            self._cond.notify_all()
        turn.done.set()

    async def sleep(self, level: int = 1) -> dict:
        """Stop generating at the next decode-step boundary and free the KV slots; returns once
        asleep: {freed_bytes, parked_rows, seconds, decode_steps}. Level 1 only (weights stay)."""
        if level != 1:
            raise ValueError(f"the hf engine sleeps at level 1 only (it keeps the weights), not {level}")
        return await self._turn(sleep=True)

    async def wake(self) -> dict:
        """Give the KV slots back and generate again: {seconds, decode_steps}."""
        return await self._turn(sleep=False)

    async def _turn(self, sleep: bool) -> dict:
        turn = Turn()
        with self._cond:
            if self._error:
                raise RuntimeError(self._error)
            if sleep == self.asleep:  # already there
                return {"seconds": 0.0, "decode_steps": self.decode_steps}
            self._sleep, self._wake = (turn, None) if sleep else (None, turn)
            self._cond.notify_all()
        await asyncio.to_thread(turn.done.wait)
        if self._error:
            raise RuntimeError(self._error)
        return turn.result

    def _release_turns(self) -> None:
        """A sleep or wake waiting for a scheduler that stopped: answer it (the caller sees why)."""
        for turn in (self._sleep, self._wake):
            if turn is not None:
                turn.done.set()
        self._sleep = self._wake = None

    def _admit(self, groups: list[list[Row]]) -> None:
        try:
            self._finish(self._decoder.admit(groups, self.version))
        except ValueError as e:  # parameters the model refuses: those requests fail, not the engine
            for req in {id(g[0].request): g[0].request for g in groups}.values():
                self._resolve(req, error=e)

    def _finish(self, rows: list[Row]) -> None:
        for r in rows:
            req = r.request
            if r.finish == "abort":
                continue
            req.done[r.index] = r
            if len(req.done) == req.n:
                self._resolve(req, [req.done[i].completion() for i in range(req.n)])

    def _resolve(self, req: Request, result=None, error: Optional[BaseException] = None) -> None:
        tokenizer = self.tokenizer
        for c in result or []:
            c.text = tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        req.loop.call_soon_threadsafe(settle, req.future, result, error)

    def _swap(self, swaps: list[Swap]) -> None:
        start = time.perf_counter()
        for s in swaps:
            try:
                with torch.no_grad(), bk.host_copies([self._params[s.named[0][0]]] if s.named else []):
                    self.last_swap_values = write(self._params, s)
                self.version, self.weights = s.version, s.weights
            except Exception as e:  # noqa: BLE001 - the loader hears it
                s.error = e
        if self._decoder.rows and not self.asleep:  # partial rollouts: the rows in flight go on with the
            self._decoder.recompute()  # new weights (asleep: their KV is rebuilt at wake)
        self.last_pause_seconds = time.perf_counter() - start
        with self._cond:
            for s in swaps:
                self._swaps.remove(s)
                s.applied.set()
            self._cond.notify_all()

    def _fail(self, why: str) -> None:
        """Every request waiting, being admitted (a prefill that raised) or being generated hears why."""
        with self._cond:
            self._error = why
            pending = self._queue + [r.request for r in self._decoder.rows] + [g[0].request for g in self._admitting]
            self._queue, self._admitting = [], []
            for s in self._swaps:
                s.error = RuntimeError(why)
                s.applied.set()
            self._release_turns()
        for req in {id(r): r for r in pending}.values():
            self._resolve(req, error=RuntimeError(why))

    # ---- weight sink ----------------------------------------------------------------------------
    def endpoints(self) -> list[Endpoint]:
        return [placement.local(self.device)]

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None:
        rx = self._receiver
        if rx is None or rx.addr != store_addr or rx.instance != instance:
            rx = self._receiver = PushReceiver(store_addr, instance, self.device)
        named = rx.receive(cmd)
        if cmd.get("adapter") is not None:
            self.load_adapter(named, cmd["adapter"], cmd["version"], cmd["weights"])
        elif rx.changes is not None and (cmd.get("delta") or {}).get("base") == self.weights:
            self._load(named, cmd["version"], cmd["weights"], rx.changes)  # a delta onto what generates: in place
        else:
            self.load(named, cmd["version"], cmd["weights"])

    def load_dir(self, path: str, version: int, weights: str) -> None:
        if lora.is_adapter_dir(path):  # backend checkpoint with LoRA: a PEFT adapter directory
            config, named = lora.read(path)
            self.load_adapter(named, config, version, weights)
        elif files.is_delta(path):  # what changed since the weights it holds: written in place
            self._apply(*delta_swap(path, self._params, self.weights, version), version, weights)
        else:
            self.load(tensorfiles.iter_dir(path), version, weights)

    def load_adapter(self, named: Iterable[tuple[str, torch.Tensor]], config: dict, version: int,
                     weights: str) -> None:
        """Merge a LoRA adapter (PEFT names and config) into the base weights and switch the
        version, as `load` does."""
        adapted = lora.pairs(named)
        for name in adapted:
            if name in self._params and name not in self._required:  # merging would change its twin too
                raise ValueError(f"the adapter adapts {name}, which is tied to another weight of the model")
            if name in self._params and name not in self._base:
                self._base[name] = self._params[name].detach().clone()
        swapped = lora.merged(self._base, adapted, config)
        touched = {n for n, _ in swapped}
        swapped += [(n, w) for n, w in self._base.items() if n not in touched]
        self._apply(swapped, None, version, weights)

    def load(self, named: Iterable[tuple[str, torch.Tensor]], version: int, weights: str) -> None:
        """Swap in named tensors and switch the version at a decode-step boundary; returns once
        generation uses them (see the module docstring for what happens to requests in flight)."""
        self._load(named, version, weights)

    def _load(self, named, version: int, weights: str, changes: Optional[dict] = None) -> None:  # changes: see write
        named = list(named)
        check_swap(named, self._params, self._required, version, self.spec.model.path)
        self._apply(named, changes, version, weights)

    def _apply(self, named: list, changes: Optional[dict], version: int, weights: str) -> None:
        swap = Swap(named, version, weights, changes=changes)
        with self._cond:
            if self._error:
                raise RuntimeError(self._error)
            running = self._thread is not None and self._thread.is_alive()
            if running:
                self._swaps.append(swap)
                self._cond.notify_all()
        if not running:  # not started (or closed): nothing generates, apply here
            self._swaps.append(swap)
            self._swap([swap])
        swap.applied.wait()
        if swap.error is not None:
            raise swap.error

    async def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        why = "hf engine closed"
        with self._cond:
            pending = self._queue + ([r.request for r in self._decoder.rows] if self._decoder else [])
            self._queue = []
            for s in self._swaps:  # a load() waiting for a boundary that will not come
                s.error = RuntimeError(why)
                s.applied.set()
            self._swaps = []
            self._release_turns()
        for req in {id(r): r for r in pending}.values():
            self._resolve(req, error=RuntimeError(why))

