"""Datasets: local files (jsonl, parquet, a `datasets` save_to_disk dir), built-ins, or
`module:factory`; prompts rendered (chat template when asked) and tokenized once; then a
deterministic, resumable stream of prompt batches sharded by data-parallel rank."""
from __future__ import annotations

import dataclasses
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
    """The job's prompts as one endless stream in a seeded per-epoch order (rank 0's rollout
    manager owns it). Each sample carries `seq`, its position in the stream (epoch x rows +
    position), which names it in checkpoints and seeds its sampling; `sample_at(seq)` rebuilds
    any sample of the stream, so prompts issued but not trained when a checkpoint is taken are
    generated again after a resume, neither skipped nor trained twice."""

    def __init__(self, spec: GRPOJobSpec, tokenizer: Any, samples: list[Sample] | None = None):
        self.samples = samples if samples is not None else load_samples(spec, tokenizer)
        self.shuffle, self.seed = spec.dataset.shuffle, spec.training.seed
        self.epoch, self.position = 0, 0
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.samples)))
            if self.shuffle:
                random.Random(self.seed * 100003 + epoch).shuffle(order)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}  # keep two epochs
            self._orders[epoch] = order
        return self._orders[epoch]

    def sample_at(self, seq: int) -> Sample:
        epoch, position = divmod(seq, len(self.samples))
        return dataclasses.replace(self.samples[self._order(epoch)[position]], seq=seq)

    def next(self) -> Sample:
        if self.position >= len(self.samples):
            self.epoch, self.position = self.epoch + 1, 0
        sample = self.sample_at(self.epoch * len(self.samples) + self.position)
        self.position += 1
        return sample

    def take(self, n: int) -> list[Sample]:
        return [self.next() for _ in range(n)]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
