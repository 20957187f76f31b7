"""The `config` a dataset class's `setup(config, tokenizer)` and a cosmos-rl reward's `config=` get:
the job's spec, readable both by its own names (`config.dataset.max_prompt_length`, `config.model.path`,
what grpojob's dataset classes read) and by the names cosmos-rl's `Config` gives the same settings,
so that code written for cosmos-rl reads them unchanged:

| cosmos-rl name | from the spec |
| --- | --- |
| `policy.model_name_or_path` | `model.path` |
| `policy.model_max_length` | `dataset.maxPromptLength + rollout.sampling.maxTokens` |
| `rollout.n_generation` | `algorithm.groupSize` |
| `rollout.max_response_length` | `rollout.sampling.maxTokens` |
| `train.seed` | `training.seed` |
| `train.train_policy.dataset.name` / `.subset` / `.split` / `.revision` | None / None / "train" / None: a class names the data it loads itself (`dataset.args` go to its constructor) |
| `train.train_policy.prompt_column_name` / `.response_column_name` | `dataset.promptField` / `dataset.answerField` |
| `train.train_policy.temperature`, `.epsilon_low`, `.epsilon_high`, `.kl_beta` | `rollout.sampling.temperature`, `algorithm.clipEpsLow`, `.clipEpsHigh`, `.klBeta` |
| `train.train_policy.overlong_reward.buffer_length` / `.penalty_factor` | `algorithm.overlong.bufferTokens` / `.penalty` |
| `train.train_policy.variant` | "gspo" when `algorithm.name` is gspo, else "grpo" |
| `train.train_policy.loss_type`, `.unbiased_loss_max_tokens` | `algorithm.lossAggregation` (seq-mean-token-sum-norm: "seq-mean-token-mean" over `maxTokens`) |
| `train.train_policy.behav_imp_weight_cap` | `algorithm.importanceCap` |
| `.lower_bound_ratio`, `.aipo_rho`, `.off_policy_masking_delta`, `.unbiased_kl_estimate`, `.balance_dp_token`, `.entropy_coeff` | cosmos-rl's defaults (3.0, None, None, False, False, 0.0): grpojob has no such setting |

cosmos-rl settings with no counterpart here are absent (AttributeError names them).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from grpojob.api.spec import GRPOJobSpec


class CosmosConfig:
    """The spec (every field by its Python name) plus cosmos-rl's names for the same settings."""

    def __init__(self, spec: GRPOJobSpec):
        self.spec = spec
        d, a, s = spec.dataset, spec.algorithm, spec.rollout.sampling
        max_prompt = d.max_prompt_length if d is not None else 0
        self.policy = SimpleNamespace(model_name_or_path=spec.model.path, model_max_length=max_prompt + s.max_tokens)
        self.rollout = SimpleNamespace(n_generation=a.group_size, max_response_length=s.max_tokens)
        dataset = SimpleNamespace(name=None, subset=None, split="train", revision=None)
        self.train = SimpleNamespace(seed=spec.training.seed, train_policy=SimpleNamespace(
            dataset=dataset, prompt_column_name=d.prompt_field if d is not None else "prompt",
            response_column_name=d.answer_field if d is not None else "answer", temperature=s.temperature,
            epsilon_low=a.clip_eps_low, epsilon_high=a.clip_eps_high, kl_beta=a.kl_beta,
            overlong_reward=SimpleNamespace(buffer_length=a.overlong.buffer_tokens, penalty_factor=a.overlong.penalty),
            variant="gspo" if a.name == "gspo" else "grpo",
            loss_type="token-mean" if a.loss_aggregation == "token-mean" else "seq-mean-token-mean",
            unbiased_loss_max_tokens=s.max_tokens if a.loss_aggregation == "seq-mean-token-sum-norm" else None,
            behav_imp_weight_cap=a.importance_cap, lower_bound_ratio=3.0, aipo_rho=None,
            off_policy_masking_delta=None, unbiased_kl_estimate=False, balance_dp_token=False, entropy_coeff=0.0))

    def __getattr__(self, name: str) -> Any:  # only for names not set above: the spec's own fields
        if name == "spec":
            raise AttributeError(name)
        return getattr(self.spec, name)

    def __repr__(self) -> str:
        return f"CosmosConfig(model={self.spec.model.path!r})"
