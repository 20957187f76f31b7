"""An AReaL-style ReMax workflow as written from the 0.1 docs (grpojob.rollout.types): it must load
unchanged. Its custom part: the greedy completion's reward is the group's baseline."""
import asyncio
import dataclasses

from grpojob.rollout.types import Group, SamplingParams


class GreedyBaselineWorkflow:
    def __init__(self, spec, tokenizer):
        self.n = spec.algorithm.group_size
        self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
        self.greedy = dataclasses.replace(self.sampling, temperature=0.0)

    async def run(self, client, sample) -> Group:
        sampled, greedy = await asyncio.gather(client.generate(sample.prompt_ids, self.n, self.sampling),
                                               client.generate(sample.prompt_ids, 1, self.greedy))
        for c in sampled:
            c.reward = float(len(c.completion_ids))
        return Group(sample=sample, completions=sampled, baseline_reward=float(len(greedy[0].completion_ids)) / 2)
