"""Rollout workflows: one sample in, one group out (see `types.Workflow`).

`spec.rollout.workflow` names a built-in (the keys of WORKFLOWS, which are exactly
`grpojob.api.plugins.BUILTIN_WORKFLOWS`) or `module:Class`. A workflow class is constructed as
`Class(spec, tokenizer)` and has `async run(client, sample) -> Group` with
`spec.algorithm.groupSize` completions. It may call `client.generate` as often as it likes
(multi-turn, tools); completions that mix policy and environment tokens set `loss_mask`, and
workflows that score their own trajectories set `Completion.reward`.

Built-ins:
- none: no workflow; the trainer's groups all come from environments (grpojob.leader.trajectories).
- single-turn: one call with n = groupSize.
- greedy-baseline (ReMax): the same group, plus one greedy completion of the same prompt in
  `Group.baseline`; the trainer's reward scorer scores it and uses its reward as the baseline.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Optional

from grpojob.api import plugins
from grpojob.api.spec import GRPOJobSpec
from grpojob.contracts.rollout import Completion, Generator, Group, Sample, SamplingParams, Workflow


class SingleTurn:
    def __init__(self, spec: GRPOJobSpec, tokenizer):
        self.group_size = spec.algorithm.group_size
        self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
        self.tokenizer = tokenizer

    def _text(self, completions: list[Completion]) -> list[Completion]:
        for c in completions:
            if not c.text and self.tokenizer is not None:
                c.text = self.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
        return completions

    async def run(self, client: Generator, sample: Sample) -> Group:
        completions = await client.generate(sample.prompt_ids, self.group_size, self.sampling)
        return Group(sample=sample, completions=self._text(completions))


class GreedyBaseline(SingleTurn):
    async def run(self, client: Generator, sample: Sample) -> Group:
        greedy = dataclasses.replace(self.sampling, temperature=0.0, seed=None)
        completions, baseline = await asyncio.gather(
            client.generate(sample.prompt_ids, self.group_size, self.sampling),
            client.generate(sample.prompt_ids, 1, greedy))
        return Group(sample=sample, completions=self._text(completions), baseline=self._text(baseline)[0])


WORKFLOWS = {"single-turn": SingleTurn, "greedy-baseline": GreedyBaseline}
assert tuple(WORKFLOWS) == plugins.BUILTIN_WORKFLOWS, "workflow registry out of step with the API"


def check_class(cls) -> Optional[str]:
    if not inspect.isclass(cls):
        return "is not a class (a workflow class constructed as Class(spec, tokenizer) is expected)"
    if not inspect.iscoroutinefunction(getattr(cls, "run", None)):
        return "has no `async def run(self, client, sample)`"
    return None


def build(spec: GRPOJobSpec, tokenizer) -> Optional[Workflow]:
    """The workflow `spec.rollout.workflow` names, constructed (None for `none`); clear errors for
    bad plug-ins."""
    name = spec.rollout.workflow
    if name == plugins.NO_WORKFLOW:
        return None
    cls = WORKFLOWS.get(name)
    if cls is None:
        try:
            cls = plugins.resolve(name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"rollout.workflow '{name}': {e}") from None
    try:
        workflow = cls(spec, tokenizer)
    except TypeError as e:
        raise ValueError(f"rollout.workflow '{name}': cannot construct it as {name}(spec, tokenizer): {e}") \
            from None
    if not inspect.iscoroutinefunction(getattr(workflow, "run", None)):
        raise ValueError(f"rollout.workflow '{name}' has no `async def run(self, client, sample)`")
    return workflow
