"""User workflows loaded by `module:Class`, as a spec names them (rollout.workflow)."""
from __future__ import annotations

from grpojob.contracts.rollout import Completion, Group, SamplingParams


class TwoTurnTool:
    """Multi-turn: the policy answers, a "tool" replies with fixed tokens, the policy answers
    again. Trained tokens are the policy's own (loss_mask 1); the tool's are masked (0). It scores
    its own trajectories: reward = fraction of policy tokens that are even ids."""

    TOOL_REPLY = [1, 40, 41, 2]

    def __init__(self, spec, tokenizer):
        self.n = spec.algorithm.group_size
        self.sampling = SamplingParams(temperature=1.0, max_tokens=4, seed=None)

    async def run(self, client, sample) -> Group:
        firsts = await client.generate(sample.prompt_ids, self.n, self.sampling)
        out = []
        for first in firsts:
            context = sample.prompt_ids + first.completion_ids + self.TOOL_REPLY
            second = (await client.generate(context, 1, self.sampling))[0]
            ids = first.completion_ids + self.TOOL_REPLY + second.completion_ids
            mask = [1] * len(first.completion_ids) + [0] * len(self.TOOL_REPLY) + [1] * len(second.completion_ids)
            own = [t for t, m in zip(ids, mask) if m]
            out.append(Completion(
                prompt_ids=sample.prompt_ids, completion_ids=ids,
                logprobs=first.logprobs + [0.0] * len(self.TOOL_REPLY) + second.logprobs,
                policy_version=min(first.policy_version, second.policy_version),
                finish_reason=second.finish_reason, loss_mask=mask,
                reward=sum(t % 2 == 0 for t in own) / max(len(own), 1)))
        return Group(sample=sample, completions=out)


class NoRun:
    def __init__(self, spec, tokenizer):
        pass

    def run(self, client, sample):  # not async: rejected
        return None
