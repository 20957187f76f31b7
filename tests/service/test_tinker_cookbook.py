"""tinker-cookbook's RL recipe machinery (tinker_cookbook.rl.train.main: rollouts through the SDK's
sampler, group-centred advantages, datums, forward_backward + optim_step with the cookbook's own
AdamParams, metrics.jsonl) run against a GRPOJob in mode service by its `base_url` and
TINKER_API_KEY=tml-<token>, on the toy task of examples/tiny-local.yaml written as a cookbook
environment (below: an Env per sample, a group per prompt; nothing is downloaded, the tokenizer is
the job's tiny model's): the recipe's reward rises.

The cookbook's own environments need what the tiny model cannot learn or a download (arithmetic
and GSM8K answers, chat renderers of real models), hence the toy environment. tinker-cookbook 0.6.1
asks for tml-renderers>=0.4.1, which the package index here lacks; it is needed only for Thinking
Machines' own models' tokenizers, so it is installed with --no-deps (docs/service.md):

    pip install --no-deps tinker-cookbook==0.6.1 && pip install chz cloudpickle termcolor blobfile tiktoken pyrage
"""
from __future__ import annotations

import asyncio
import json
import statistics
from functools import partial
from typing import Sequence

import pytest

cookbook = pytest.importorskip("tinker_cookbook", reason="tinker-cookbook is not installed (see this module's doc)")

import chz  # noqa: E402
import tinker  # noqa: E402
from tinker_cookbook.rl import train  # noqa: E402
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult  # noqa: E402
from tinker_cookbook.tokenizer_utils import get_tokenizer  # noqa: E402

from grpojob.data.builtin import toy as toy_rows  # noqa: E402
from grpojob.rewards.builtin import toy as toy_reward  # noqa: E402
from tests.service.test_tinker_sdk import RANK, TOKEN, job  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.slow
STEPS = 40


class ToyEnv(Env):
    def __init__(self, row: dict, tokenizer):
        self.row, self.tokenizer = row, tokenizer
        self.stop = [tokenizer.eos_token_id]

    async def initial_observation(self):
        return tinker.ModelInput.from_ints(self.tokenizer(self.row["prompt"])["input_ids"]), self.stop

    async def step(self, action, *, extra=None) -> StepResult:
        text = self.tokenizer.decode(action, skip_special_tokens=True)
        reward = toy_reward(self.row["prompt"], text, self.row["answer"])
        return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.stop, metrics={"toy": reward})


class ToyGroup(EnvGroupBuilder):
    def __init__(self, make_env, size: int):
        self.make_env, self.size = make_env, size

    async def make_envs(self) -> Sequence[Env]:
        return [self.make_env() for _ in range(self.size)]

    def logging_tags(self) -> list[str]:
        return ["toy"]


class ToyDataset(RLDataset):
    def __init__(self, rows: list[dict], tokenizer, batch_size: int, group_size: int, batches: int):
        self.rows, self.tokenizer = rows, tokenizer
        self.batch_size, self.group_size, self.batches = batch_size, group_size, batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        start = index * self.batch_size
        rows = [self.rows[(start + i) % len(self.rows)] for i in range(self.batch_size)]
        return [ToyGroup(partial(ToyEnv, row, self.tokenizer), self.group_size) for row in rows]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class ToyDatasetBuilder(RLDatasetBuilder):
    model_name_for_tokenizer: str
    batch_size: int = 16
    group_size: int = 8
    batches: int = 100

    async def __call__(self) -> tuple[ToyDataset, None]:
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        return ToyDataset(list(toy_rows(size=64, seed=0)), tokenizer, self.batch_size, self.group_size,
                          self.batches), None


def test_a_cookbook_rl_recipe_learns_against_a_grpojob(job, tmp_path, monkeypatch):  # noqa: F811
    run, _, model, url = job
    monkeypatch.setenv("TINKER_API_KEY", "tml-" + TOKEN)
    config = train.Config(learning_rate=3e-3, dataset_builder=ToyDatasetBuilder(model_name_for_tokenizer=model),
                          model_name=model, lora_rank=RANK, recipe_name="grpojob_toy", max_tokens=4,
                          log_path=str(tmp_path / "cookbook"), eval_every=0, save_every=0, base_url=url,
                          max_steps=STEPS, num_groups_to_log=0, rollout_json_export=False)
    asyncio.run(train.main(config))
    records = [json.loads(line) for line in (tmp_path / "cookbook" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["env/all/reward/total"] for r in records if "env/all/reward/total" in r]
    assert len(rewards) == STEPS and run.trainer.step == STEPS
    first, last = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
    print(f"tinker-cookbook rl.train: reward {first:.3f} -> {last:.3f} in {STEPS} steps")
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
