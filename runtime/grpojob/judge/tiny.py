"""A tiny reward model for the toy task, built and trained here (nothing from a hub): a Qwen2
sequence classifier (one output; its sigmoid is the reward) taught, in a few hundred steps on CPU,
the share of a text's words that are the toy task's category words (grpojob.data.builtin).

    python -m grpojob.judge.tiny .cache/tiny-reward-model

Its training texts are what the tiny policy writes: a few pieces, each a category word or a random
token of the vocabulary; the target is the share of category words. The policy never sees the rule,
only this model's scores (docs/services.md).
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from grpojob.data.builtin import TOY_CATEGORIES


def _words() -> list[str]:
    words = [w for ws in TOY_CATEGORIES.values() if ws for w in ws]
    return words + [str(n) for n in range(100)]  # numbers: any integer


def _example(rng: random.Random, words: list[str], vocab: list[str]) -> tuple[str, float]:
    pieces, hits = [], 0
    share = rng.random()
    for _ in range(rng.randint(1, 4)):
        if rng.random() < share:
            pieces.append(" " + rng.choice(words))
            hits += 1
        else:
            pieces.append(rng.choice(vocab))
    return "".join(pieces), hits / len(pieces)


def build(output: str | Path, steps: int = 300, seed: int = 0) -> Path:
    """Write the trained classifier and its tokenizer at `output` (returns it). Deterministic for a seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from grpojob.tiny import SIZES, build_tokenizer

    dims = dict(SIZES["tiny"])
    tokenizer = build_tokenizer(dims.pop("vocab_size"))
    tokenizer.truncation_side = "left"
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=1024, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         id2label={0: "category_words"}, label2id={"category_words": 0}, **dims)
    model = Qwen2ForSequenceClassification(config)
    rng, words = random.Random(seed), _words()
    specials = set(tokenizer.all_special_ids)
    vocab = [tokenizer.decode([i]) for i in range(len(tokenizer)) if i not in specials]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        texts, targets = zip(*(_example(rng, words, vocab) for _ in range(64)))
        batch = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=64)
        logits = model(**batch).logits.squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(targets))
        opt.zero_grad()
        loss.backward()
        opt.step()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    return output


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output")
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args(argv)
    print(f"tiny reward model written to {build(args.output, steps=args.steps)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
