"""A cosmos-rl-style rollout engine as written from the 0.1 docs (grpojob.rollout.types): it
must load unchanged. Its generation is canned (no model), so its custom part is cheap to see."""
import asyncio

from grpojob.rollout.types import Completion, SamplingParams


class EchoRollout:
    backend = "legacy-echo"
    weight_sync = ("auto", "checkpoint")

    def __init__(self, spec):
        self.spec, self.version, self.weights = spec, 0, "disk"
        self.last_pause_seconds, self.tokenizer, self.vocab_size, self.context_len = None, None, 100, 64

    async def start(self) -> None: ...

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        await asyncio.sleep(0)
        # token i of completion k is (last prompt token + k + i) % vocab: each completion differs
        return [Completion(prompt_ids=list(prompt_ids),
                           completion_ids=[(prompt_ids[-1] + k + i) % self.vocab_size
                                           for i in range(sampling.max_tokens)],
                           logprobs=[-1.0] * sampling.max_tokens, policy_version=self.version, text=f"echo {k}")
                for k in range(n)]

    def load_info(self): return 0, 0
    def endpoints(self): return []
    def receive_push(self, cmd, store_addr, instance): ...
    def load_dir(self, path, version, weights): self.version = version
    def errored(self): return None
    async def close(self): ...
