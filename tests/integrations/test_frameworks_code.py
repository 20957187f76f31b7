"""The frameworks' own shipped code, unchanged, in grpojob: verl's default_compute_score over rows in
verl's dataset format (cosmos-rl's documented dataset and gsm8k_reward_fn: test_cosmos_docs.py). These
run in the frameworks set (.ci/sets/frameworks.sh) and skip where the packages are not installed."""
import asyncio

import pytest

from grpojob.api.validate import check_plugins
from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.rewards import RewardScorer

from ..trainer.conftest import make_job
from .conftest import framework

VERL_ROW = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "what is 7 plus 5 ?"}],
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "12"},
            "extra_info": {"split": "train", "index": 0}}


def group(sample, texts):
    return Group(sample, [Completion(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], policy_version=0, text=t)
                          for t in texts])


def test_verls_default_compute_score_scores_rows_in_verls_format(tiny_dir, tokenizer):
    framework("verl.utils.reward_score")
    job = make_job(tiny_dir, rewards=[{"name": "verl.utils.reward_score:default_compute_score"}])
    assert check_plugins(job) == []
    g = group(Sample(0, "what is 7 plus 5 ?", [1], dict(VERL_ROW)), ["#### 12", "#### 11", "twelve"])
    asyncio.run(RewardScorer(job.spec, tokenizer).score_group(g))
    assert g.rewards == [1.0, 0.0, 0.0]  # verl's gsm8k: the data_source picked its scorer, ground_truth the truth
