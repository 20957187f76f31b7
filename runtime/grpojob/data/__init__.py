"""Datasets: local files (jsonl, parquet, a `datasets` save_to_disk dir), built-ins, or
`module:factory`; prompts rendered (chat template when asked) and tokenized once; then a
deterministic, resumable stream of prompt batches sharded by data-parallel rank."""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any, Iterable

from ..api import plugins
from ..api.spec import DatasetSpec, GRPOJobSpec
from ..rollout.types import Sample
from .builtin import DATASETS

log = logging.getLogger("grpojob.data")


class DatasetError(ValueError):
    pass


def _format(spec: DatasetSpec, path: Path) -> str:
    if spec.format != "auto":
        return spec.format
    if path.is_dir():
        return "disk"
    if path.suffix in (".jsonl", ".json"):
        return "jsonl"
    if path.suffix == ".parquet":
        return "parquet"
    raise DatasetError(f"spec.dataset.path: cannot tell the format of '{path}'; set spec.dataset.format")


def load_rows(spec: DatasetSpec) -> list[dict[str, Any]]:
    """The dataset's rows as dicts."""
    if spec.factory:
        factory = DATASETS.get(spec.factory) or plugins.resolve(spec.factory)
        try:
            rows: Iterable[Any] = factory(**spec.args)
            rows = [dict(r) for r in rows]
        except Exception as e:
            raise DatasetError(f"spec.dataset.factory '{spec.factory}' failed: {type(e).__name__}: {e}") from e
        return rows
    assert spec.path is not None
    path = Path(spec.path)
    if not path.exists():
        raise DatasetError(f"spec.dataset.path: '{path}' does not exist")
    fmt = _format(spec, path)
    if fmt == "jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"spec.dataset.path: {path}:{n}: not JSON: {e}") from None
        return rows
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    return [dict(r) for r in ds]


def render_prompt(spec: GRPOJobSpec, tokenizer: Any, row: dict[str, Any], index: int) -> str:
    d = spec.dataset
    if d.messages_field:
        messages = row.get(d.messages_field)
        if not isinstance(messages, list):
            raise DatasetError(f"dataset row {index} has no list field '{d.messages_field}' "
                               f"(spec.dataset.messagesField)")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if d.prompt_field not in row:
        raise DatasetError(f"dataset row {index} has no field '{d.prompt_field}' (spec.dataset.promptField); "
                           f"it has {sorted(row)}")
    text = str(row[d.prompt_field])
    if spec.model.use_chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def load_samples(spec: GRPOJobSpec, tokenizer: Any) -> list[Sample]:
    """Every usable row, rendered and tokenized; prompts over maxPromptLength are dropped."""
    rows = load_rows(spec.dataset)
    templated = bool(spec.dataset.messages_field or spec.model.use_chat_template)
    samples, dropped = [], 0
    for i, row in enumerate(rows):
        text = render_prompt(spec, tokenizer, row, i)
        ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
        if len(ids) > spec.dataset.max_prompt_length:
            dropped += 1
            continue
        if spec.dataset.answer_field != "answer" and spec.dataset.answer_field in row:
            row = {**row, "answer": row[spec.dataset.answer_field]}  # rewards read `answer`
        samples.append(Sample(index=i, prompt=text, prompt_ids=list(ids), row=row))
    if dropped:
        log.info("dropped prompts longer than maxPromptLength", extra={"dropped": dropped, "kept": len(samples)})
    if not samples:
        raise DatasetError(f"no usable prompts: {len(rows)} rows, {dropped} longer than "
                           f"spec.dataset.maxPromptLength ({spec.dataset.max_prompt_length})")
    return samples


class PromptStream:
    """Global batches of promptsPerStep samples in a seeded per-epoch order; rank r of `world`
    gets every world-th sample of each global batch, so the global batch is the same for any
    world size (the distributed-equivalence property)."""

    def __init__(self, spec: GRPOJobSpec, tokenizer: Any, rank: int = 0, world: int = 1,
                 samples: list[Sample] | None = None):
        if spec.training.prompts_per_step % world:
            raise DatasetError("training.promptsPerStep must be a multiple of the data-parallel world size")
        self.samples = samples if samples is not None else load_samples(spec, tokenizer)
        self.batch = spec.training.prompts_per_step
        self.shuffle, self.seed = spec.dataset.shuffle, spec.training.seed
        self.rank, self.world = rank, world
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def _next_global(self) -> list[Sample]:
        out = []
        while len(out) < self.batch:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            out.append(self.samples[self._order[self.position]])
            self.position += 1
        return out

    def next_global_batch(self) -> list[Sample]:
        return self._next_global()

    def next_batch(self) -> list[Sample]:
        return self._next_global()[self.rank::self.world]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._make_order()
