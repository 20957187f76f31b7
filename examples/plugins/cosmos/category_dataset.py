"""cosmos-rl's dataset class, with cosmos-rl's own names: setup(config, tokenizer), __len__,
__getitem__ and query_reference_answer (cosmos-rl's other examples name it get_reference_answer;
grpojob takes either, or its own reference_answer).

The spec names it as `dataset: {class: category_dataset.py:CategoryDataset, args: {...}}`; grpojob
builds it with the args, calls setup(config, tokenizer) once (config: the job's spec, also under
cosmos-rl's names: config.policy.model_name_or_path, config.rollout.n_generation, ...; see
grpojob/data/config.py), takes item i as the prompt (text here; a list of chat messages or a dict row
also work) and query_reference_answer(i) as the `reference` the rewards get. The task is the toy
one (name words of a category; category_reward.py scores them), with prompts of its own.
"""
from __future__ import annotations

import random

CATEGORIES = ("animals", "colors", "numbers")


class CategoryDataset:
    def __init__(self, size: int = 24, seed: int = 0):
        self.size, self.seed = size, seed
        self.items: list[tuple[str, str]] = []

    def setup(self, config, tokenizer, *args, **kwargs) -> None:
        """Build the prompts (cosmos-rl loads its data here, from config.train.train_policy.dataset)."""
        rng = random.Random(self.seed)
        cats = [CATEGORIES[i % len(CATEGORIES)] for i in range(self.size)]
        rng.shuffle(cats)
        limit = config.dataset.max_prompt_length
        for c in cats:
            prompt = f"name some {c} :"
            assert len(tokenizer(prompt)["input_ids"]) <= limit, "prompt longer than dataset.maxPromptLength"
            self.items.append((prompt, c))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> str:
        return self.items[idx][0]

    def query_reference_answer(self, idx: int) -> str:
        return self.items[idx][1]
