"""The contract between the trainer and the rollout side (no torch here)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol


def derive_seed(*parts: int) -> int:
    """A 31-bit sampling seed from integers: stable across processes and Python versions."""
    digest = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2 ** 31)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    seed: Optional[int] = None

    @classmethod
    def from_spec(cls, sampling) -> "SamplingParams":
        return cls(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                   max_tokens=sampling.max_tokens)


@dataclass
class Completion:
    """One sampled completion.

    `logprobs[i]` is log softmax(logits / temperature)[completion_ids[i]] under the policy that
    generated it (temperature 1 when greedy), over the full vocabulary: the trainer computes the
    same quantity, so their difference is the importance ratio against the rollout policy."""
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str = "stop"  # stop | length
    text: str = ""
    # Multi-turn workflows: 1 where the token is the policy's own (trained on), 0 for tool/user tokens.
    loss_mask: Optional[list[int]] = None
    # Set by workflows that score their own trajectories; else the trainer's rewards score it.
    reward: Optional[float] = None
    # The policy version of each token, when a weight push landed mid-generation (partial
    # rollouts); None: every token has `policy_version`, which is always the OLDEST of them.
    versions: Optional[list[int]] = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class Sample:
    """One dataset row on its way to the policy."""
    index: int
    prompt: str  # text as rendered for the model (chat template applied)
    prompt_ids: list[int]
    row: dict[str, Any] = field(default_factory=dict)  # every field of the row (answer, ...)
    seq: int = -1  # position in the job's prompt stream (data.PromptStream); -1 outside it


@dataclass
class Group:
    """The completions of one prompt: the unit GRPO computes advantages over."""
    sample: Sample
    completions: list[Completion]
    rewards: Optional[list[float]] = None
    # per reward function: the values it scored (a trl-form reward may leave some out: None)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
    # greedy-baseline workflow (ReMax): one greedy completion of the same prompt, sampled with
    # the same policy version; the reward scorer scores it and subtracts its reward as baseline.
    baseline: Optional[Completion] = None
    baseline_reward: Optional[float] = None  # set by the reward scorer when baseline is set


class Generator(Protocol):
    """What a rollout workflow calls to sample from the policy: the HTTP rollout client on a
    cluster, an in-process engine in tests."""

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        ...


class GroupRejected(Exception):
    """Raised by a workflow's `run`: the prompt's group is dropped, neither trained nor an error, and
    the next prompt drawn in its place (AReaL's dynamic_filter_fn). `group`: the rejected group, which
    an evaluation (scoring every prompt, filtering nothing) uses."""

    def __init__(self, message: str, group: Optional["Group"] = None):
        super().__init__(message)
        self.group = group


class Workflow(Protocol):
    """A rollout workflow: turns one sample into one group (it may call the policy several times).
    Built-ins: single-turn, greedy-baseline; users: `module:Class` taking (spec, tokenizer)."""

    async def run(self, client: Generator, sample: Sample) -> Group:
        ...


class Scorer(Protocol):
    """Scores a group in place (grpojob.rewards.RewardScorer)."""
    async def score_group(self, group: Group) -> None: ...


class Prompts(Protocol):
    """The prompt stream (grpojob.data): samples in order, and any one again by its position."""
    def next(self) -> Sample: ...

    def sample_at(self, seq: int) -> Sample: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
