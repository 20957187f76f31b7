"""AReaL's rollout workflows (`areal.api.workflow_api.RolloutWorkflow`: `RLVRWorkflow`,
`MultiTurnWorkflow`, a user's own) as a GRPOJob's rollout workflow, unchanged.

A user's file builds the AReaL workflow as an AReaL training script does, and names the result:

    from areal.api.cli_args import GenerationHyperparameters
    from areal.workflow.rlvr import RLVRWorkflow
    from grpojob.integrations.areal import workflow

    GSM8K = workflow(lambda spec, tokenizer: RLVRWorkflow(
        reward_fn=gsm8k_reward_fn, gconfig=GenerationHyperparameters(max_new_tokens=64), tokenizer=tokenizer))

    # spec.rollout.workflow: my_rollout.py:GSM8K

For each prompt the group is `algorithm.groupSize` concurrent `arun_episode(engine, data)` calls, as
AReaL forms a group (`data`: the dataset row). `engine.agenerate(ModelRequest)` generates on the job's
rollout servers (the spec's temperature, topP and topK: the trainer's log-probs are at that
temperature; `max_new_tokens` at most `maxTokens`) and answers a `ModelResponse` with the tokens,
log-probs and per-token policy versions. Each episode's tensors (`input_ids`, `loss_mask`, `logprobs`,
`versions`, `rewards`) become a completion through grpojob.integrations.episodes: the prompt is what
precedes the first trained token, multi-turn masks kept, the episode's reward its reward. An episode
that returns None is rejected (AReaL's way); the episodes are run again until `groupSize` are kept,
at most REJECT_ROUNDS rounds. `workflow(build, dynamic_filter_fn=fn)` filters groups as AReaL's
`trainer.train(dynamic_filter_fn=...)` does: `fn` gets the group's episodes concatenated (AReaL's
`concat_padded_tensors`: `rewards` of shape [groupSize], ...) and a group it refuses is dropped
(GroupRejected: not trained, the next prompt drawn instead; an evaluation still scores it). AReaL's
`n_samples` must be 1 (a group is groupSize episodes): `grpojob validate` refuses the workflow
otherwise, naming spec.rollout.workflow (where it can load the model's tokenizer to build it), and so
does the trainer at start. `workflow(build, group_baseline=False)`: the episodes' rewards are trained
on as they are, no group mean taken from them (the group's baseline is 0), as AReaL's REINFORCE
actor of its "Training Algorithm" guide trains the ReMax workflow's reward differences
(examples/plugins/areal/remax_areal.py); with algorithm.advantageNormalization none the advantage
is the episode's reward.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Optional

from grpojob.contracts.rollout import Generator, Group, GroupRejected, Sample, SamplingParams
from grpojob.integrations.episodes import Episode, EpisodeError, from_sequence, to_group

__all__ = ["InferenceEngine", "workflow", "REJECT_ROUNDS"]

REJECT_ROUNDS = 4


class InferenceEngine:
    """What an AReaL workflow's `engine` is here: `agenerate` over the job's rollout servers."""

    def __init__(self, client: Generator, sampling: SamplingParams):
        self.client, self.sampling = client, sampling

    async def agenerate(self, req: Any) -> Any:
        from areal.api.io_struct import ModelResponse

        g = req.gconfig
        if g.n_samples != 1:
            raise ValueError(f"AReaL's agenerate takes n_samples 1, got {g.n_samples}")
        limit = min(int(g.max_new_tokens), self.sampling.max_tokens) if g.max_new_tokens else self.sampling.max_tokens
        sampling = dataclasses.replace(self.sampling, max_tokens=limit,
                                       temperature=0.0 if g.greedy else self.sampling.temperature)
        (c,) = await self.client.generate(list(req.input_ids), 1, sampling)
        versions = list(c.versions) if c.versions is not None else [c.policy_version] * len(c.completion_ids)
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=list(c.completion_ids),
                             output_logprobs=list(c.logprobs), output_versions=versions,
                             stop_reason="length" if c.truncated else "stop", tokenizer=req.tokenizer)


def _episode(traj: Optional[dict], version: int) -> Optional[Episode]:
    """AReaL's episode tensors (batch dim 1) as an Episode; None stays None (rejected)."""
    if traj is None:
        return None
    reward = traj.get("rewards")
    reward = float(reward.reshape(-1)[0]) if hasattr(reward, "reshape") else (None if reward is None else float(reward))
    return from_sequence(traj["input_ids"], traj["loss_mask"], traj.get("logprobs"), traj.get("versions"),
                         reward=reward, version=version)


def _n_samples_problem(areal: Any) -> Optional[str]:
    gconfig = getattr(areal, "gconfig", None)
    n = int(getattr(gconfig, "n_samples", 1)) if gconfig is not None else 1
    if n == 1:
        return None
    return (f"its AReaL workflow {type(areal).__name__} asks n_samples {n}: a group here is algorithm.groupSize "
            f"episodes of n_samples 1 (set n_samples=1, and groupSize: {n})")


def _accept(fn: Any) -> Optional[Callable[[dict], bool]]:
    """AReaL's dynamic_filter_fn: a callable or a "module.function" path (as AReaL takes it)."""
    if fn is None or callable(fn):
        return fn
    import importlib
    module, _, name = str(fn).rpartition(".")
    return getattr(importlib.import_module(module), name)


def workflow(build: Callable[[Any, Any], Any], dynamic_filter_fn: Any = None, group_baseline: bool = True) -> type:
    """A grpojob workflow class (constructed as Class(spec, tokenizer)) running the AReaL workflow
    `build(spec, tokenizer)` returns; `dynamic_filter_fn`: AReaL's group filter; `group_baseline`
    False: the rewards are the advantages' source as they are (module docstring)."""

    class AReaLWorkflow:
        def __init__(self, spec, tokenizer):
            self.areal = build(spec, tokenizer)
            why = _n_samples_problem(self.areal)
            if why:
                raise ValueError(f"spec.rollout.workflow: {why}")
            self.group_size, self.tokenizer = spec.algorithm.group_size, tokenizer
            self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
            self.accept = _accept(dynamic_filter_fn)

        @classmethod
        def check_spec(cls, spec) -> Optional[str]:
            """What `grpojob validate` finds (None: nothing, or it cannot build the workflow here)."""
            try:
                from transformers import AutoTokenizer
                areal = build(spec, AutoTokenizer.from_pretrained(spec.model.path))
            except Exception:  # noqa: BLE001 - no tokenizer here (a cluster path): the trainer checks at start
                return None
            return _n_samples_problem(areal)

        def _filtered(self, sample: Sample, trajs: list[dict]) -> Group:
            group = to_group(sample, [_episode(t, 0) for t in trajs], self.tokenizer)
            if not group_baseline:
                group.baseline_reward = 0.0  # an outside baseline replaces the group's mean
            if self.accept is not None:
                from areal.utils.data import concat_padded_tensors
                if not bool(self.accept(concat_padded_tensors(trajs))):
                    raise GroupRejected(f"AReaL's dynamic_filter_fn rejected the group of sample {sample.index}",
                                        group=group)
            return group

        async def run(self, client: Generator, sample: Sample) -> Group:
            engine = InferenceEngine(client, self.sampling)
            kept: list[dict] = []
            for _ in range(REJECT_ROUNDS):
                want = self.group_size - len(kept)
                trajs = await asyncio.gather(*(self.areal.arun_episode(engine, dict(sample.row)) for _ in range(want)))
                kept += [t for t in trajs if t is not None]
                if len(kept) >= self.group_size:
                    return self._filtered(sample, kept)
            if not kept:
                raise EpisodeError(f"AReaL workflow {type(self.areal).__name__} rejected every episode of sample "
                                   f"{sample.index} ({REJECT_ROUNDS} rounds of {self.group_size})")
            return self._filtered(sample, kept)  # a smaller group: what was kept

    AReaLWorkflow.__qualname__ = AReaLWorkflow.__name__ = f"AReaLWorkflow[{getattr(build, '__name__', 'build')}]"
    return AReaLWorkflow
