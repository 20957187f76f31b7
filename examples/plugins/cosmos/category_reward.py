"""cosmos-rl's custom reward, as its customization guide writes one:
`(to_be_evaluated, reference, *args, **kwargs) -> float`, where `to_be_evaluated` is the rollout's
generated text and `reference` the dataset's reference answer (CategoryDataset.query_reference_answer).
Like cosmos-rl's own rewards it may return `(value, dict)`: the dict's numbers are reported beside
the reward (metrics.jsonl's rewards["category_reward/words"]), only the value is summed.

The spec names it as `rewards: [{name: category_reward.py:category_reward}]`; grpojob recognises
cosmos-rl's signature by the parameter name `to_be_evaluated` and calls it as cosmos-rl does (the
completion and the reference by position; prompt= and tokenizer= among the keywords).
"""
from __future__ import annotations

from typing import Any, Optional

from grpojob.plugins import TOY_CATEGORIES


def category_reward(to_be_evaluated: str, reference: Optional[Any] = None, *args, **kwargs) -> tuple[float, dict]:
    """Share of the generated words that belong to the reference category (any integer for numbers),
    and the number of words as a part to report."""
    words = to_be_evaluated.lower().split()
    if not words or reference not in TOY_CATEGORIES:
        return 0.0, {"words": len(words)}
    members = TOY_CATEGORIES[reference]
    return sum(w.isdigit() if members is None else w in members for w in words) / len(words), {"words": len(words)}
