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
import json
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
    return _save(model, tokenizer, output)


def _save(model, tokenizer, output: str | Path) -> Path:
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    return output


# The tiny generative judge's rubric and parser (a spec.judges entry of kind generative uses them):
# it answers "score: 9" for a category word, "score: 1" for any other vocabulary token, and
# "I cannot tell" for "??" (an answer the parser cannot read, on purpose: the failure path).
RUBRIC_SYSTEM = "Rate the word."
RUBRIC_TEMPLATE = "Rate: {completion}"
RUBRIC_PATTERN = r"score: (\d+)"
RUBRIC_RANGE = (0, 9)
UNREADABLE = "??"


def _rubric_example(rng: random.Random, words: list[str], vocab: list[str]) -> tuple[str, str]:
    kind = rng.random()
    if kind < 0.15:
        return " " + UNREADABLE, "I cannot tell"
    if kind < 0.55:
        return " " + rng.choice(words), "score: 9"
    return rng.choice(vocab), "score: 1"


def build_generative(output: str | Path, steps: int = 120, seed: int = 0) -> Path:
    """Write a tiny chat model (Qwen2, ChatML) trained to answer the rubric above (returns its path):
    a random model cannot judge, so the tests' judge is taught, in seconds, answers the parser reads
    and one it cannot. Deterministic for a seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpojob.tiny import SIZES, build_tokenizer

    dims = dict(SIZES["tiny"])
    tokenizer = build_tokenizer(dims.pop("vocab_size"))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=1024, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=[tokenizer.eos_token_id, end], bos_token_id=tokenizer.eos_token_id, **dims)
    model = Qwen2ForCausalLM(config)
    rng, words = random.Random(seed), _words()
    specials = set(tokenizer.all_special_ids)
    vocab = [t for t in (tokenizer.decode([i]) for i in range(len(tokenizer)) if i not in specials)
             if t.strip() not in words and UNREADABLE not in t]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    seen: dict[tuple[str, str], tuple[list[int], list[int]]] = {}  # rendering is slower than a step

    def row(completion: str, answer: str) -> tuple[list[int], list[int]]:
        if (completion, answer) not in seen:
            chat = [{"role": "system", "content": RUBRIC_SYSTEM},
                    {"role": "user", "content": RUBRIC_TEMPLATE.format(completion=completion)}]
            asked = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            q, a = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (asked, answer))
            seen[completion, answer] = (q + a + [end], [-100] * len(q) + a + [end])  # loss on the answer only
        return seen[completion, answer]

    for _ in range(steps):
        rows = [row(*_rubric_example(rng, words, vocab)) for _ in range(64)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r, _ in rows])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in rows])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    output = _save(model, tokenizer, output)
    (output / "generation_config.json").write_text(json.dumps(  # stop at the end of the assistant's turn
        {"eos_token_id": [tokenizer.eos_token_id, end], "pad_token_id": tokenizer.pad_token_id}))
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
