"""The training service's types: its JSON wire format (snake_case) and what the client's user
builds, shaped after Tinker's (`Datum`, `ModelInput`, `TensorData`, `AdamParams`,
`SamplingParams`, `ForwardBackwardOutput`, ...), so a Tinker training loop ports by changing its
imports. The same models validate requests in the client (an error before anything is sent) and in
the trainer (grpojob.service.wire adds the job's limits). Pydantic only: no torch or numpy at
import (TensorData's conversions import them when called).

A datum follows Tinker's alignment: position i of `model_input` predicts `target_tokens[i]`, and
every loss input has one value per model_input token. Losses are sums over tokens (scale
advantages or weights to get a mean):

    cross_entropy        target_tokens, weights (optional, default 1)   -weights * log p
    importance_sampling  target_tokens, logprobs (sampler's), advantages  -A * p / q
    ppo                  as importance_sampling; loss_fn_config clip_low_threshold (0.8),
                         clip_high_threshold (1.2)                        -min(A r, A clip(r))
    cispo                as ppo                                           -sg(clip(r)) A log p
    dro                  as importance_sampling; loss_fn_config beta (0.05)  -(A log p - beta/2 (log r)^2)
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpojob.api.base import invalid

LossFn = Literal["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
# loss_fn -> (inputs it needs, inputs it may take)
LOSS_INPUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": (("target_tokens",), ("weights",)),
    "importance_sampling": (("target_tokens", "logprobs", "advantages"), ()),
    "ppo": (("target_tokens", "logprobs", "advantages"), ()),
    "cispo": (("target_tokens", "logprobs", "advantages"), ()),
    "dro": (("target_tokens", "logprobs", "advantages"), ()),
}
# loss_fn -> its loss_fn_config keys and their defaults (Tinker's PPO clips the ratio to [0.8, 1.2])
LOSS_CONFIG: dict[str, dict[str, float]] = {"ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
                                            "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
                                            "dro": {"beta": 0.05}}
CLIPPED = frozenset({"ppo", "cispo"})  # the losses whose ratio is clipped: clip_fraction:mean
INT_INPUTS = frozenset({"target_tokens"})
POLICY_PATH = "grpojob://policy/"  # save_weights_for_sampler's path: this prefix and the policy version


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- inputs -----------------------------------------------------------------------------------------

class EncodedTextChunk(Wire):
    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


class ModelInput(Wire):
    """Token ids fed to the model (Tinker's ModelInput; text chunks only)."""
    chunks: list[EncodedTextChunk]

    @classmethod
    def from_ints(cls, tokens: list[int]) -> "ModelInput":
        return cls(chunks=[EncodedTextChunk(tokens=list(tokens))])

    @classmethod
    def empty(cls) -> "ModelInput":
        return cls(chunks=[])

    def to_ints(self) -> list[int]:
        return [t for c in self.chunks for t in c.tokens]

    def append_int(self, token: int) -> "ModelInput":
        return ModelInput(chunks=[*self.chunks, EncodedTextChunk(tokens=[token])])

    @property
    def length(self) -> int:
        return sum(c.length for c in self.chunks)


class TensorData(Wire):
    """A 1-D tensor: its values, their dtype (int64 or float32) and optionally its shape."""
    data: list[Union[int, float]]
    dtype: Literal["int64", "float32"]
    shape: Optional[list[int]] = None

    @model_validator(mode="after")
    def _consistent(self) -> "TensorData":
        if self.shape is not None and self.shape != [len(self.data)]:
            raise invalid("shape", f"{self.shape}: only 1-D tensors of {len(self.data)} values are taken")
        for i, v in enumerate(self.data):
            if self.dtype == "int64" and (not isinstance(v, int) or isinstance(v, bool)):
                raise invalid(f"data[{i}]", f"{v!r} is not an integer (dtype int64)")
            if self.dtype == "float32" and not math.isfinite(v):
                raise invalid(f"data[{i}]", f"{v} is not a finite number")
        return self

    @classmethod
    def from_list(cls, values: list, dtype: str) -> "TensorData":
        """int64 values stay as they are: a float token id (2.7) is refused, never truncated."""
        return cls(**_fields(values, dtype))

    def tolist(self) -> list:
        return list(self.data)

    @classmethod
    def from_numpy(cls, array: Any) -> "TensorData":
        """A 1-D numpy array: integers as int64, floats as float32 (Tinker's TensorData.from_numpy)."""
        import numpy as np
        array = np.asarray(array)
        if array.ndim != 1:
            raise ValueError(f"a {array.ndim}-D array: only 1-D tensors are taken")
        return cls.from_list(array.tolist(), "int64" if np.issubdtype(array.dtype, np.integer) else "float32")

    @classmethod
    def from_torch(cls, tensor: Any) -> "TensorData":
        """A 1-D torch tensor (any device), as from_numpy."""
        return cls.from_numpy(tensor.detach().cpu().numpy())

    def to_numpy(self) -> Any:
        import numpy as np
        return np.asarray(self.data, dtype=np.int64 if self.dtype == "int64" else np.float32)

    def to_torch(self) -> Any:
        import torch
        return torch.as_tensor(self.to_numpy())


def _fields(values: list, dtype: str) -> dict[str, Any]:
    """TensorData's fields for a plain list: floats made float (an int logprob is fine), int64
    values left for TensorData to check."""
    values = list(values)
    if dtype == "float32":
        values = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in values]
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def _as_tensor(key: str, value: Any) -> Any:
    """Plain lists (and arrays or tensors, through their tolist()) become TensorData of the dtype
    the key implies, as Tinker's Datum does; validated as that key's field, so an error names it
    (`loss_fn_inputs.advantages.data[1]`)."""
    if isinstance(value, (TensorData, dict)):
        return value
    tolist = getattr(value, "tolist", None)  # numpy arrays, torch tensors: whatever the user has
    values = tolist() if callable(tolist) else value
    if not isinstance(values, (list, tuple)):
        return value  # let validation say what it is
    return _fields(values, "int64" if key in INT_INPUTS else "float32")


class Datum(Wire):
    """One self-contained training example: the tokens in, and the per-token inputs of the loss."""
    model_input: ModelInput
    loss_fn_inputs: dict[str, TensorData] = Field(default_factory=dict)

    @field_validator("loss_fn_inputs", mode="before")
    @classmethod
    def _tensors(cls, v: Any) -> Any:
        return {k: _as_tensor(k, x) for k, x in v.items()} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _aligned(self) -> "Datum":
        n = self.model_input.length
        if n == 0:
            raise invalid("model_input", "no tokens")
        for key, t in self.loss_fn_inputs.items():
            if len(t.data) != n:
                raise invalid(f"loss_fn_inputs.{key}", f"{len(t.data)} values for {n} model_input tokens "
                              f"(one per position: position i predicts target_tokens[i])")
            want = "int64" if key in INT_INPUTS else "float32"
            if t.dtype != want:
                raise invalid(f"loss_fn_inputs.{key}.dtype", f"{t.dtype}; {key} is {want}")
        return self

    def inputs(self, key: str) -> Optional[list]:
        t = self.loss_fn_inputs.get(key)
        return None if t is None else t.data


class ForwardBackwardInput(Wire):
    data: list[Datum] = Field(min_length=1)
    loss_fn: LossFn
    loss_fn_config: Optional[dict[str, float]] = None

    @model_validator(mode="after")
    def _inputs_of_the_loss(self) -> "ForwardBackwardInput":
        needed, optional = LOSS_INPUTS[self.loss_fn]
        for i, d in enumerate(self.data):
            missing = [k for k in needed if k not in d.loss_fn_inputs]
            if missing:
                raise invalid(f"data[{i}].loss_fn_inputs", f"{self.loss_fn} needs {', '.join(missing)}")
            for k in d.loss_fn_inputs:
                if k not in needed + optional:
                    raise invalid(f"data[{i}].loss_fn_inputs.{k}", f"not an input of {self.loss_fn} "
                                  f"(it takes {', '.join(needed + optional)})")
        known = LOSS_CONFIG.get(self.loss_fn, {})
        for k, v in (self.loss_fn_config or {}).items():
            if k not in known:
                raise invalid(f"loss_fn_config.{k}", f"not a setting of {self.loss_fn}"
                              + (f" (it has {', '.join(known)})" if known else " (it has none)"))
            if not math.isfinite(v):
                raise invalid(f"loss_fn_config.{k}", f"{v} is not a finite number")
        low, high = self.config("clip_low_threshold"), self.config("clip_high_threshold")
        if self.loss_fn in CLIPPED and not 0 <= low <= 1 <= high:
            raise invalid("loss_fn_config", f"clip thresholds [{low}, {high}] must hold 1 (0 <= low <= 1 <= high)")
        if self.loss_fn == "dro" and self.config("beta") < 0:
            raise invalid("loss_fn_config.beta", f"{self.config('beta')}: the penalty's weight is not negative")
        return self

    def config(self, key: str) -> float:
        return (self.loss_fn_config or {}).get(key, LOSS_CONFIG.get(self.loss_fn, {}).get(key, math.nan))


class AdamParams(Wire):
    """One optimizer step's settings, with Tinker's defaults (learning rate 1e-4, betas 0.9/0.95,
    eps 1e-12, no weight decay, grad_clip_norm 0: no clipping). None keeps the optimizer's own
    (training.weightDecay, AdamW's betas 0.9/0.999 and eps 1e-8 unless a call set others), and
    grad_clip_norm None clips at training.gradClip."""
    learning_rate: float = Field(1e-4, gt=0, le=1)
    beta1: Optional[float] = Field(0.9, ge=0, lt=1)
    beta2: Optional[float] = Field(0.95, ge=0, lt=1)
    eps: Optional[float] = Field(1e-12, gt=0)
    weight_decay: Optional[float] = Field(0.0, ge=0)
    grad_clip_norm: Optional[float] = Field(0.0, ge=0)


class OptimStepRequest(Wire):
    adam_params: AdamParams


class SamplingParams(Wire):
    """Tinker's fields; max_tokens unset: the job's rollout.sampling.maxTokens. `stop`: strings or
    token ids; a completion is cut after the first (grpojob.service.stops); generation stops at EOS
    either way, so [] (no stop at all) is refused."""
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    seed: Optional[int] = Field(None, ge=0)
    stop: Union[None, str, list[str], list[int]] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        if v is not None and len(v) == 0:
            raise ValueError(f"{v!r}: no stop at all (not even EOS) is not supported: the rollout servers always "
                             "stop at EOS; leave it unset")
        if isinstance(v, list) and any(isinstance(s, str) and not s for s in v):
            raise ValueError("an empty stop string")
        return v


class SampleRequest(Wire):
    prompt: ModelInput
    num_samples: int = Field(1, ge=1, le=256)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    # Only servers holding at least this policy version answer (what a SamplingClient made by
    # save_weights_and_get_sampling_client asks for).
    min_policy_version: Optional[int] = Field(None, ge=0)

    @model_validator(mode="after")
    def _prompt(self) -> "SampleRequest":
        if self.prompt.length == 0:
            raise invalid("prompt", "no tokens")
        return self


class SaveStateRequest(Wire):
    name: Optional[str] = Field(None, min_length=1, max_length=200)  # load_state takes it as the path


class LoadStateRequest(Wire):
    path: str = Field(min_length=1, max_length=4096)
    optimizer: bool = True  # False: the weights only, the optimizer's state starts afresh (Tinker's load_state)


class SaveWeightsRequest(Wire):
    name: Optional[str] = Field(None, max_length=200)  # for the log; weights are named by policy version


# ---- outputs ----------------------------------------------------------------------------------------

class ForwardBackwardOutput(Wire):
    loss_fn_output_type: str = "TensorData"
    loss_fn_outputs: list[dict[str, TensorData]]  # per datum: logprobs (the trainer's, one per position)
    metrics: dict[str, float] = Field(default_factory=dict)  # loss:sum, tokens:sum, (ppo) clip_fraction:mean


class OptimStepResponse(Wire):
    metrics: dict[str, float] = Field(default_factory=dict)  # grad_norm, learning_rate, step, policy_version


class SaveWeightsForSamplerResponse(Wire):
    path: str  # POLICY_PATH + version: create_sampling_client(model_path=...) takes it
    policy_version: int


class SampledSequence(Wire):
    stop_reason: Literal["stop", "length"]
    tokens: list[int]
    logprobs: list[float]  # log p(token) under the sampling policy, at the sampling temperature
    policy_version: int
    text: str = ""


class SampleResponse(Wire):
    sequences: list[SampledSequence]


class SaveStateResponse(Wire):
    path: str
    step: int
    name: Optional[str] = None


class LoadStateResponse(Wire):
    path: str
    step: int
    policy_version: int


class ServiceInfo(Wire):
    model_path: str
    tokenizer_path: str
    vocab_size: int
    max_sequence_tokens: int  # training.microBatchTokens: one datum's (or prompt + completion's) limit
    step: int
    policy_version: int
    ranks: int
    loss_fns: list[str]
    sampling: dict[str, Any]  # the job's rollout.sampling defaults


def policy_version_of(path: str) -> int:
    """The policy version of a save_weights_for_sampler path."""
    if not path.startswith(POLICY_PATH) or not path[len(POLICY_PATH):].isdecimal():
        raise ValueError(f"'{path}' is not a sampler weights path ({POLICY_PATH}<version>)")
    return int(path[len(POLICY_PATH):])
