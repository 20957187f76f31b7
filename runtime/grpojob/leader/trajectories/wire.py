"""The trajectory API's wire format: JSON bodies (snake_case, like /generate and OpenAI), validated
with pydantic against the job's limits. Every refusal names the field it is about:
`groups[0].completions[3].token_ids[5]: 9999 is outside the vocabulary (512 tokens)`.

A group is one prompt and `algorithm.groupSize` completions, each with the token ids the policy
sampled, their log-probs (log softmax(logits / temperature) of the sampled token, as the rollout
servers return them), the policy version that produced them (per token when a weight push landed
mid-generation) and an optional loss mask (1: the policy's own token, trained on; 0: a tool or
user token inside a multi-turn completion). Rewards are the environment's own, one per completion,
with optional named parts that show up per name in the trainer's metrics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from grpojob.api.base import FIELD_ERROR, invalid
from grpojob.contracts.rollout import Completion, Group, Sample

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LOGPROB_SLACK = 1e-4  # float rounding above 0 that a sampled token's log-prob may show


@dataclass(frozen=True)
class Limits:
    """What a submission must fit (the validation context)."""
    group_size: int  # spec.algorithm.groupSize
    vocab_size: int  # the policy's embedding rows
    max_sequence_tokens: int  # spec.training.microBatchTokens: prompt + completion, one packed micro-batch


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _limits(info: ValidationInfo) -> Limits:
    assert isinstance(info.context, Limits), "validate with context=Limits(...)"
    return info.context


def _outside(ids: list[int], vocab: int, name: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise invalid(f"{name}[{i}]", f"{t} is outside the vocabulary ({vocab} tokens)")


def _finite(values: list[float], name: str) -> None:
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise invalid(f"{name}[{i}]", f"{v} is not a finite number")


class RegisterIn(_In):
    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    # Groups this environment commits to per training step: each step waits for them. None: its
    # groups are taken as they come (first come, first trained).
    groups_per_step: Optional[int] = Field(None, ge=1)
    replica: Optional[str] = Field(None, max_length=253)  # the process registering, for logs


class CompletionIn(_In):
    token_ids: list[int] = Field(min_length=1)
    logprobs: list[float]
    policy_version: Optional[int] = Field(None, ge=0)  # the oldest version among its tokens
    versions: Optional[list[int]] = None  # per token, when it varies (partial rollouts)
    loss_mask: Optional[list[int]] = None
    finish_reason: str = Field("stop", pattern="^(stop|length)$")
    text: str = ""

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "CompletionIn":
        n = len(self.token_ids)
        for name in ("logprobs", "versions", "loss_mask"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise invalid(name, f"{len(values)} entries for {n} token_ids")
        _outside(self.token_ids, _limits(info).vocab_size, "token_ids")
        _finite(self.logprobs, "logprobs")
        mask = self.loss_mask or [1] * n
        for i, (lp, bit) in enumerate(zip(self.logprobs, mask)):
            if bit not in (0, 1):
                raise invalid(f"loss_mask[{i}]", f"{bit}: use 1 (trained on) or 0 (not the policy's token)")
            if bit and lp > LOGPROB_SLACK:
                raise invalid(f"logprobs[{i}]", f"{lp} is a log-probability above 0")
        if self.versions is not None:
            if any(v < 0 for v in self.versions):
                raise invalid("versions", "policy versions are >= 0")
            oldest = min(self.versions)
            if self.policy_version is not None and self.policy_version != oldest:
                raise invalid("policy_version", f"{self.policy_version}, but the oldest of versions is {oldest}")
            self.policy_version = oldest
        if self.policy_version is None:
            raise invalid("policy_version", "required (or versions, one per token)")
        return self


class GroupIn(_In):
    prompt_ids: list[int] = Field(min_length=1)
    prompt: str = ""  # its text, for logs and rewards that read it
    completions: list[CompletionIn]
    rewards: list[float]
    reward_parts: dict[str, list[float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "GroupIn":
        lim = _limits(info)
        if len(self.completions) != lim.group_size:
            raise invalid("completions", f"{len(self.completions)} completions; a group has "
                          f"algorithm.groupSize = {lim.group_size}")
        _outside(self.prompt_ids, lim.vocab_size, "prompt_ids")
        parts = [(f"reward_parts.{k}", v) for k, v in self.reward_parts.items()]
        for name, values in [("rewards", self.rewards), *parts]:
            if len(values) != len(self.completions):
                raise invalid(name, f"{len(values)} values for {len(self.completions)} completions")
            _finite(values, name)
        for i, c in enumerate(self.completions):
            total = len(self.prompt_ids) + len(c.token_ids)
            if total > lim.max_sequence_tokens:
                raise invalid(f"completions[{i}]", f"prompt + completion = {total} tokens, more than "
                              f"training.microBatchTokens ({lim.max_sequence_tokens})")
        return self

    @property
    def version(self) -> int:
        """The group's version: the oldest among its tokens."""
        return min(c.policy_version for c in self.completions)  # type: ignore[type-var]

    def to_group(self, environment: str) -> Group:
        sample = Sample(index=-1, prompt=self.prompt, prompt_ids=list(self.prompt_ids),
                        row={"environment": environment})
        completions = [Completion(prompt_ids=list(self.prompt_ids), completion_ids=c.token_ids, logprobs=c.logprobs,
                                  policy_version=int(c.policy_version or 0), finish_reason=c.finish_reason,
                                  text=c.text, loss_mask=c.loss_mask, reward=r, versions=c.versions)
                       for c, r in zip(self.completions, self.rewards)]
        return Group(sample=sample, completions=completions, rewards=list(self.rewards),
                     reward_parts={k: list(v) for k, v in self.reward_parts.items()})


class SubmitIn(_In):
    environment: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    groups: list[GroupIn] = Field(min_length=1, max_length=4096)


class SessionTurnIn(_In):
    """One turn of an agent session, posted by the rollout server that served it
    (grpojob.rollout.sessions.turn)."""
    mode: str = Field(pattern="^(chat|text)$")
    group: Optional[str] = Field(None, max_length=128)
    environment: Optional[str] = Field(None, max_length=63, pattern=NAME_PATTERN)  # its groups' queue name
    prompt_ids: list[int] = Field(min_length=1)  # what the model was given: the session's tokens + new context
    continued: bool  # the server built prompt_ids on the session's tokens
    rendered: str  # the prompt as text (the chat template's, or the client's)
    returned: str  # the text the client got
    messages: int = Field(ge=0)  # chat: the request's message count
    completion: CompletionIn

    @model_validator(mode="after")
    def _vocab(self, info: ValidationInfo) -> "SessionTurnIn":
        _outside(self.prompt_ids, _limits(info).vocab_size, "prompt_ids")
        return self


class SessionRewardIn(_In):
    """The end of a session: its reward (None: the job's rewards score it), optional named parts,
    and fields for the rewards (the `row` they get, e.g. the reference answer)."""
    reward: Optional[float] = None
    reward_parts: dict[str, float] = Field(default_factory=dict)
    row: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _finite(self) -> "SessionRewardIn":
        values = ([("reward", self.reward)] if self.reward is not None else []) + \
            [(f"reward_parts.{k}", v) for k, v in self.reward_parts.items()]
        for name, v in values:
            if not math.isfinite(v):
                raise invalid(name, f"{v} is not a finite number")
        return self


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(exc: ValidationError, most: int = 5) -> str:
    """`field.path: message; ...` for the first `most` problems."""
    msgs = []
    for err in exc.errors():
        path = _loc(err["loc"])
        if err["type"] == FIELD_ERROR:
            sub = err["ctx"]["subpath"]
            path = path + sub if sub.startswith("[") or not path else f"{path}.{sub}"
            msg = err["ctx"]["message"]
        elif err["type"] == "json_invalid":
            path, msg = "body", f"not JSON: {err['msg']}"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        msgs.append(f"{path or 'body'}: {msg}")
    more = f" ({len(msgs) - most} more)" if len(msgs) > most else ""
    return "; ".join(msgs[:most]) + more
