"""Built-in datasets, generated locally (nothing from a hub)."""
from __future__ import annotations

import random
from typing import Any, Iterator

from grpojob.data.reasoning import reasoning_gym

# The toy task: categories of words the tiny tokenizer knows.
TOY_CATEGORIES = {
    "animals": "cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split(),
    "colors": "red blue green gold pink gray black white brown orange purple".split(),
    "numbers": None,  # any integer
}
_TOY_TEMPLATES = ("list {c} :", "say some {c} :", "name {c} :", "{c} please :")


def toy(categories: list[str] | None = None, size: int = 64, seed: int = 0) -> Iterator[dict[str, Any]]:
    """The toy task of the local demo: a prompt asks for words of a category, the `toy` reward is
    the share of completion words in it. Dense enough for a random tiny model to learn in minutes."""
    cats = list(categories or TOY_CATEGORIES)
    unknown = [c for c in cats if c not in TOY_CATEGORIES]
    if unknown:
        raise ValueError(f"toy categories {unknown} unknown: use {sorted(TOY_CATEGORIES)}")
    rng = random.Random(seed)
    for i in range(size):
        c = cats[i % len(cats)]
        yield {"prompt": rng.choice(_TOY_TEMPLATES).format(c=c), "answer": c}


def countdown(size: int = 256, count: int = 3, max_number: int = 20, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Countdown problems: reach `target` with + - * / using each number at most once."""
    rng = random.Random(seed)
    ops = ("+", "-", "*")
    for _ in range(size):
        nums = [rng.randint(1, max_number) for _ in range(count)]
        expr = str(nums[0])
        for n in nums[1:]:
            expr = f"({expr} {rng.choice(ops)} {n})"
        target = eval(expr)  # noqa: S307 - built from integers and + - * only
        listed = " , ".join(map(str, nums))
        yield {"prompt": f"using the numbers {listed} make {target} . <answer>", "numbers": nums,
               "target": target, "answer": str(target)}


DATASETS = {"toy": toy, "countdown": countdown, "reasoning-gym": reasoning_gym}
# Built-ins whose rows carry chat `messages` (a system prompt and the question), rendered with the
# chat template when spec.model.useChatTemplate; their `prompt` text otherwise.
CHAT_ROWS = frozenset({"reasoning-gym"})
