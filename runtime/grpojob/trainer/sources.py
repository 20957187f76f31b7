"""Where the trainer's groups come from and where its weights go: the two injected parts.

GroupSource:     next_groups(samples, policy_version) -> list[Group] (one group per sample, in
                 order, each with groupSize completions carrying rollout log-probs and the
                 policy version that sampled them). On a cluster: the rollout client/manager.
WeightPublisher: publish(named_tensors, version) with the FULL Hugging Face-named state dict,
                 called after every weightSync.everySteps-th step on each rank that has one
                 (rank 0 for a remote weight sync; every rank for the in-process source).

`InProcessSource` is both: it samples with transformers from its own copy of the policy, which
only changes when weights are published to it, so it behaves like a remote rollout server
serving version v (including staleness when weightSync.everySteps > 1).
"""
from __future__ import annotations

import copy
import logging
from typing import Iterable, Protocol, Sequence

import torch
from torch import Tensor

from ..rollout import hf_generate
from ..rollout.types import Completion, Group, Sample, SamplingParams

log = logging.getLogger("grpojob.trainer.sources")


class GroupSource(Protocol):
    def next_groups(self, samples: Sequence[Sample], policy_version: int) -> list[Group]:
        ...


class WeightPublisher(Protocol):
    def publish(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        ...


class InProcessSource:
    """Samples `group_size` completions per prompt with hf_generate from a private weight copy.

    per_prompt_seed: sample each prompt in its own call seeded by (seed, version, prompt index),
    so what a prompt gets does not depend on how prompts are sharded over ranks (the
    distributed-equivalence test needs that); slower than one batched call."""

    def __init__(self, model: torch.nn.Module, tokenizer, sampling: SamplingParams, group_size: int,
                 seed: int = 0, rank: int = 0, version: int = 0, per_prompt_seed: bool = False,
                 copy_model: bool = True):
        self.model = (copy.deepcopy(model) if copy_model else model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.group_size = group_size
        self.seed, self.rank = seed, rank
        self.version = version
        self.per_prompt_seed = per_prompt_seed
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos

    @classmethod
    def for_trainer(cls, trainer, **kw) -> "InProcessSource":
        """For a Trainer: its own copy of the model loaded from spec.model.path (a sharded policy
        cannot be copied), at version 0; a resumed trainer publishes its weights before step one."""
        spec = trainer.spec
        model = trainer.load_model()
        return cls(model, trainer.tokenizer, SamplingParams.from_spec(spec.rollout.sampling),
                   spec.algorithm.group_size, seed=spec.training.seed, rank=trainer.env.rank,
                   version=0, copy_model=False, **kw)

    def next_groups(self, samples: Sequence[Sample], policy_version: int) -> list[Group]:
        if not samples:
            return []
        if self.per_prompt_seed:
            outs = [self._generate([s], self._seed(s.index, 0))[0] for s in samples]
        else:
            outs = self._generate(samples, self._seed(samples[0].index, self.rank))
        return [Group(sample=s, completions=cs) for s, cs in zip(samples, outs)]

    def _seed(self, index: int, rank: int) -> int:
        # Seeded by what the step is (not by RNG history), so a resumed run samples exactly what
        # an uninterrupted one would.
        return (self.seed * 1_000_003 + self.version * 7919 + rank * 104_729 + index) % (2 ** 31)

    def _generate(self, samples: Sequence[Sample], seed: int) -> list[list[Completion]]:
        sampling = SamplingParams(temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                                  top_k=self.sampling.top_k, max_tokens=self.sampling.max_tokens, seed=seed)
        device = next(self.model.parameters()).device
        # fork_rng: hf_generate seeds the global RNG; the trainer's own stream stays untouched.
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            return hf_generate.generate(self.model, [s.prompt_ids for s in samples], self.group_size, sampling,
                                        eos_token_id=self.eos, pad_token_id=self.pad,
                                        policy_version=self.version)

    def publish(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        state = dict(named_tensors)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if not _tied(self.model, k)]:
            raise ValueError(f"published weights do not match the rollout model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        self.version = version


def _tied(model: torch.nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
