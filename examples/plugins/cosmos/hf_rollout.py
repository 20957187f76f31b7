"""cosmos-rl's example custom rollout engine (ExampleHFRollout), ported: plain transformers
generation behind grpojob's engine protocol (grpojob.plugins.Engine).

cosmos-rl registers a `RolloutBase` subclass as `rollout.backend` (init_engine, rollout_generation,
get/set_underlying_model); here the spec names the class, `rollout: {backend: hf_rollout.py:ExampleHFRollout}`,
and the protocol's parts map onto cosmos-rl's: start ~ init_engine, generate ~ rollout_generation
(with per-token log-probs, which grpojob's importance correction needs), receive_push / load_dir
~ set_underlying_model (weights arrive through grpojob's weight sync: WeightReceiver yields the
pushed tensors by Hugging Face name). One generate call at a time: simple, not fast.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Optional

import torch

from grpojob.plugins import INITIAL_WEIGHTS, Completion, SamplingParams, WeightReceiver, read_dir

log = logging.getLogger("grpojob.rollout")


class ExampleHFRollout:
    backend = "example-hf"
    weight_sync = ("auto", "gloo", "shm", "checkpoint")  # what this engine can receive (host memory)

    def __init__(self, spec):
        self.spec = spec
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.version, self.weights = 0, INITIAL_WEIGHTS
        self.last_pause_seconds = None  # a weight load holds the lock: generation waits that long
        self.model = self.tokenizer = None
        self.vocab_size = self.context_len = 0
        self.generated = 0  # completions served (its /info and log show it)
        self._lock = threading.Lock()  # one generation or one weight load at a time
        self._receiver = WeightReceiver(self.device)

    async def start(self) -> None:  # cosmos-rl: init_engine
        from transformers import AutoModelForCausalLM, AutoTokenizer

        def load():
            m = self.spec.model
            model = AutoModelForCausalLM.from_pretrained(m.path, dtype=torch.float32).to(self.device).eval()
            return model, AutoTokenizer.from_pretrained(m.tokenizer or m.path)

        self.model, self.tokenizer = await asyncio.to_thread(load)
        self.vocab_size = self.model.config.vocab_size
        self.context_len = int(self.model.config.max_position_embeddings)
        log.info("example-hf engine: %s loaded on %s", self.spec.model.path, self.device)

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        return await asyncio.to_thread(self._generate, list(prompt_ids), n, sampling)

    def _generate(self, prompt_ids: list[int], n: int, s: SamplingParams) -> list[Completion]:
        greedy = s.temperature == 0
        temperature = 1.0 if greedy else s.temperature
        eos = self.tokenizer.eos_token_id
        if s.top_p < 1:
            raise ValueError("example-hf engine: topP < 1 is not supported (use topK)")
        gen = torch.Generator(device=self.device)
        if s.seed is not None:
            gen.manual_seed(s.seed)
        with self._lock, torch.no_grad():
            version = self.version
            ids = torch.tensor([prompt_ids] * n, device=self.device)
            out = []
            for _ in range(s.max_tokens):  # plain sampling loop: logits -> temperature -> sample
                logits = self.model(ids).logits[:, -1, :].float()
                logp = torch.log_softmax(logits / temperature, dim=-1)
                probs = logp.exp()
                if s.top_k > 0:
                    kth = probs.topk(s.top_k, dim=-1).values[:, -1:]
                    probs = torch.where(probs < kth, 0.0, probs)
                nxt = probs.argmax(-1) if greedy else torch.multinomial(probs, 1, generator=gen).squeeze(1)
                out.append((nxt, logp.gather(1, nxt[:, None]).squeeze(1)))
                ids = torch.cat([ids, nxt[:, None]], dim=1)
        completions = []
        for i in range(n):
            toks = [int(t[i]) for t, _ in out]
            lps = [float(lp[i]) for _, lp in out]
            stop = toks.index(eos) + 1 if eos in toks else None
            toks, lps = toks[:stop], lps[:stop]
            completions.append(Completion(prompt_ids=prompt_ids, completion_ids=toks, logprobs=lps,
                                          policy_version=version, finish_reason="stop" if stop else "length",
                                          text=self.tokenizer.decode(toks, skip_special_tokens=True)))
        self.generated += n
        return completions

    def load_info(self) -> tuple[int, int]:
        return 0, 1 if self._lock.locked() else 0

    # ---- weights: cosmos-rl's set_underlying_model ----------------------------------------------
    def endpoints(self) -> list:
        return self._receiver.endpoints()

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None:
        self._load(self._receiver.receive(cmd, store_addr, instance), cmd["version"], cmd["weights"])

    def load_dir(self, path: str, version: int, weights: str) -> None:
        self._load(read_dir(path), version, weights)

    def _load(self, named, version: int, weights: str) -> None:
        params = dict(self.model.state_dict())
        named = list(named)
        unknown = [k for k, _ in named if k not in params]
        if unknown:
            raise ValueError(f"example-hf engine: pushed tensors the model does not have: {unknown[:3]}")
        with self._lock, torch.no_grad():
            t0 = time.perf_counter()
            for k, t in named:
                params[k].copy_(t)
            self.version, self.weights = version, weights
            self.last_pause_seconds = time.perf_counter() - t0
        log.info("example-hf engine: now serving policy version %d (%d completions so far)", version, self.generated)

    def errored(self) -> Optional[str]:
        return None

    async def close(self) -> None:
        self.model = None
