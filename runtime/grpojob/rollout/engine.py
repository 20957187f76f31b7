"""The rollout engine interface, and the factory the server uses.

An engine generates completions for token-id prompts (the `Generator` contract of `types.py`,
plus bookkeeping) and is the `WeightSink` that weight sync loads into. Engines tag every
completion with the policy version of the weights that produced it: `hf` swaps weights between
decode steps, after the requests in flight finish (one version per completion) or, with
algorithm.partialRollouts, at once with the requests in flight resumed on the new weights
(`Completion.versions` per token); `vllm` swaps weights between engine steps (in flight). A
completion that spans a swap is tagged with the version it started at (the older one: its
staleness is never under-counted). The per-token log-probs are those of the weights that
actually produced each token either way.
"""
from __future__ import annotations

from typing import Optional, Protocol

from ..api.spec import GRPOJobSpec
from .types import Completion, SamplingParams

BACKENDS = ("hf", "vllm")


class Engine(Protocol):
    backend: str
    workers: int
    version: int  # policy version of the weights loaded now
    weights: str  # weights id (see grpojob.sync.protocol)
    tokenizer: object
    vocab_size: int
    context_len: int  # prompt + completion tokens that fit

    async def start(self) -> None: ...

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]: ...

    def load_info(self) -> tuple[int, int]:
        """(requests waiting for the engine, requests being generated)."""
        ...

    def receive_push(self, cmd: dict, store_addr: str, instance: str) -> None: ...

    def load_dir(self, path: str, version: int, weights: str) -> None: ...

    def errored(self) -> Optional[str]:
        """Why the engine is dead, or None."""
        ...

    async def close(self) -> None: ...


def torch_dtype_name(spec: GRPOJobSpec, on_gpu: bool) -> str:
    """spec.model.dtype with auto resolved: bfloat16 on GPU, float32 on CPU."""
    if spec.model.dtype != "auto":
        return spec.model.dtype
    return "bfloat16" if on_gpu else "float32"


def max_model_len(spec: GRPOJobSpec) -> int:
    return spec.rollout.max_model_len or spec.dataset.max_prompt_length + spec.rollout.sampling.max_tokens


def build(backend: str, spec: GRPOJobSpec) -> Engine:
    if backend == "hf":
        from .hf_engine import HFEngine
        return HFEngine(spec)
    if backend == "vllm":
        from .vllm_engine import VLLMEngine
        return VLLMEngine(spec)
    raise ValueError(f"unknown rollout backend '{backend}': use one of {', '.join(BACKENDS)}")


def check_prompt(prompt_ids: list[int], vocab_size: int, limit: int) -> Optional[str]:
    """Why a prompt cannot be generated from, or None."""
    if not prompt_ids:
        return "prompt_ids is empty"
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        return f"prompt_ids holds token ids outside the vocabulary (size {vocab_size}): {bad[:5]}"
    if len(prompt_ids) >= limit:
        return f"prompt of {len(prompt_ids)} tokens does not fit the context ({limit} tokens)"
    return None
