"""A real in-process Generator for workflow and manager tests: hf_generate on a model, tagged with
a policy version the test moves (as a weight push would), honouring min_version the way a server
that has not received the newest push yet does (it makes the caller wait)."""
from __future__ import annotations

import asyncio
import time

from grpojob.rollout import hf_generate
from grpojob.contracts.rollout import Completion, SamplingParams


class ModelGenerator:
    def __init__(self, model, tokenizer, version: int = 0):
        self.model, self.tokenizer, self.version = model, tokenizer, version
        self.calls: list[dict] = []

    async def generate(self, prompt_ids, n: int, sampling: SamplingParams, *, min_version=None) -> list[Completion]:
        end = time.monotonic() + 30
        while min_version is not None and self.version < min_version:
            assert time.monotonic() < end, f"generator stuck at version {self.version} < {min_version}"
            await asyncio.sleep(0.01)
        version = self.version
        self.calls.append({"prompt_ids": list(prompt_ids), "n": n, "sampling": sampling, "version": version,
                           "min_version": min_version})
        out = await asyncio.to_thread(
            hf_generate.generate, self.model, [list(prompt_ids)], n, sampling,
            eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
            policy_version=version)
        return out[0]
