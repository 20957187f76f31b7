"""AReaL's ReMax workflow, ported (AReaL's customization guide, "Training Algorithm": a
RolloutWorkflow that generates sampled and greedy completions together and uses the reward
difference as the training signal).

The spec names it as `rollout: {workflow: remax_workflow:ReMaxWorkflow}` (a module of spec.code's
directory, on PYTHONPATH). Like AReaL's arun_episode, `run` sends the sampled request (n =
groupSize) and the greedy one concurrently, scores both itself with the job's rewards, and hands
the trainer completions that carry their own reward plus the group's greedy reward as its
baseline: the advantage of completion i is r_i - r_greedy (ReMax), not r_i - mean(r). With
algorithm.advantageNormalization none that is exactly ReMax's REINFORCE signal.
"""
from __future__ import annotations

import asyncio
import dataclasses

from grpojob.plugins import Group, RewardScorer, SamplingParams


class ReMaxWorkflow:
    def __init__(self, spec, tokenizer):
        self.n = spec.algorithm.group_size
        self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
        self.greedy = dataclasses.replace(self.sampling, temperature=0.0, seed=None)
        self.scorer = RewardScorer(spec, tokenizer)  # the job's rewards, with their weights
        self.tokenizer = tokenizer

    async def run(self, client, sample) -> Group:
        sampled, greedy = await asyncio.gather(
            client.generate(sample.prompt_ids, self.n, self.sampling),
            client.generate(sample.prompt_ids, 1, self.greedy))
        for c in [*sampled, *greedy]:
            c.text = c.text or self.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        scored = Group(sample=sample, completions=sampled, baseline=greedy[0])
        await self.scorer.score_group(scored)  # rewards of the samples and of the greedy baseline
        for c, r in zip(sampled, scored.rewards):
            c.reward = r  # a workflow that scores its own trajectories: the trainer keeps these
        return Group(sample=sample, completions=sampled, baseline_reward=scored.baseline_reward)
