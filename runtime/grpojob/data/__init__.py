"""Datasets: files (jsonl, json, csv, parquet, globs of them, a `datasets` save_to_disk dir), local
or at a URL, or a Hub dataset by name (grpojob.data.sources), read whole or streamed
(grpojob.data.streaming); built-ins, a factory (`module:function`) or a dataset class
(`module:Class`); prompts rendered (chat template when asked) and tokenized once; then a
deterministic, resumable stream of prompts.

A factory is called with spec.dataset.args and returns an iterable of dict rows (a list, a
generator, a `datasets.Dataset`). A dataset class (cosmos-rl's shape) is constructed with the args,
then `setup(config, tokenizer)` if it has one (config: grpojob.data.config.CosmosConfig, the spec
under its own and cosmos-rl's names); `len(ds)` rows, `ds[i]` is the prompt text, a list of chat
messages (rendered with the tokenizer's chat template) or a dict row, and the answer the rewards get
as `answer` (None: the row's own) is `ds.reference_answer(i)`, or cosmos-rl's
`query_reference_answer(i)` or `get_reference_answer(i)`: whichever one it has."""
from __future__ import annotations

import dataclasses
import glob
import inspect
import itertools
import json
import logging
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from grpojob.api import data_url, plugins
from grpojob.api.spec import DatasetSpec, GRPOJobSpec
from grpojob.contracts.rollout import Sample
from grpojob.data import sources
from grpojob.data.config import CosmosConfig
from grpojob.data.builtin import CHAT_ROWS, DATASETS

log = logging.getLogger("grpojob.data")


class DatasetError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class PromptSettings:
    """What reading and rendering prompts takes of a job, made once by `of`: the dataset (the
    training set, or an evaluation set), whether plain prompts get the model's chat template, the
    seed of the order, and how many issued prompts a streamed reader keeps for `sample_at`. `job` is
    only handed to a dataset class's `setup(spec, tokenizer)` (its published contract)."""
    dataset: DatasetSpec
    chat_template: bool = False
    seed: int = 0
    keep: int = 1024
    job: Optional[GRPOJobSpec] = None

    @classmethod
    def of(cls, spec: GRPOJobSpec, dataset: Optional[DatasetSpec] = None) -> "PromptSettings":
        # Kept: at least twice as many as the rollout manager can have issued but not trained
        # (its run-ahead, stale drops, refills).
        a = spec.algorithm
        ahead = (a.max_staleness + spec.weight_sync.every_steps + 2) * spec.training.prompts_per_step
        keep = max(1024, 2 * ahead * max(1, int(a.max_resample_factor)))
        d = dataset if dataset is not None else spec.dataset
        assert d is not None, "a job without a dataset has no prompts"
        return cls(dataset=d, chat_template=spec.model.use_chat_template, seed=spec.training.seed, keep=keep,
                   job=spec)


_FACTORY_CONTRACT = ("a dataset factory must return an iterable of dict rows, e.g. [{'prompt': ..., "
                     "'answer': ...}, ...] (a list, a generator or a datasets.Dataset); a factory that writes "
                     "a file should return its rows, or write it once and set spec.dataset.path instead")
_CLASS_METHODS = ("__len__", "__getitem__")
# The reference answer's method, by its name in grpojob and in cosmos-rl (its docs use both of these)
REFERENCE_METHODS = ("reference_answer", "query_reference_answer", "get_reference_answer")
_CLASS_SHAPE = (f"a dataset class with __len__, __getitem__, one of {', '.join(REFERENCE_METHODS)}, and "
                f"optionally setup(config, tokenizer)")


def reference_method(cls) -> Optional[str]:
    """The name of the one reference-answer method `cls` has (None: none)."""
    found = [m for m in REFERENCE_METHODS if callable(getattr(cls, m, None))]
    return found[0] if len(found) == 1 else None


def check_factory(fn) -> Optional[str]:
    if inspect.isclass(fn):
        return "is a class: name a dataset class in spec.dataset.class (spec.dataset.factory takes a function)"
    return None if callable(fn) else "is not callable (a function returning an iterable of dict rows is expected)"


def check_class(cls) -> Optional[str]:
    if not inspect.isclass(cls):
        return f"is not a class ({_CLASS_SHAPE} is expected)"
    missing = [m for m in _CLASS_METHODS if not callable(getattr(cls, m, None))]
    found = [m for m in REFERENCE_METHODS if callable(getattr(cls, m, None))]
    if not found:
        missing.append(" or ".join(REFERENCE_METHODS))
    if missing:
        return f"lacks {', '.join(missing)} ({_CLASS_SHAPE} is expected)"
    if len(found) > 1:
        return f"has {' and '.join(found)}: keep one, so that it is clear which gives the reference answer"
    setup = getattr(cls, "setup", None)
    if setup is not None and not callable(setup):
        return "has a setup that is not a method (setup(config, tokenizer) is expected)"
    return None


def _rows_of(source: Any, where: str) -> list[dict[str, Any]]:
    """Dict rows from what a factory returned; DatasetError saying what it must return."""
    if source is None or isinstance(source, (str, bytes, Mapping)) or not isinstance(source, Iterable):
        raise DatasetError(f"{where} returned {type(source).__name__ if source is not None else 'None'}: "
                           f"{_FACTORY_CONTRACT}")
    rows = []
    for i, r in enumerate(source):
        if not isinstance(r, Mapping):
            raise DatasetError(f"{where}: row {i} is a {type(r).__name__}, not a dict: {_FACTORY_CONTRACT}")
        rows.append(dict(r))
    return rows


def _class_rows(settings: PromptSettings, tokenizer: Any, field: str) -> list[dict[str, Any]]:
    d = settings.dataset
    where = f"{field}.class '{d.class_}'"
    cls = plugins.resolve(d.class_)
    why = check_class(cls)
    if why:
        raise DatasetError(f"{where} {why}")
    try:
        ds = cls(**d.args)
        if callable(getattr(ds, "setup", None)):  # optional, as in cosmos-rl
            ds.setup(CosmosConfig(settings.job) if settings.job is not None else None, tokenizer)
        answer_of = getattr(ds, reference_method(cls))
        rows = []
        for i in range(len(ds)):
            item = ds[i]
            row = dict(item) if isinstance(item, Mapping) else \
                {MESSAGES: list(item)} if isinstance(item, list) else {d.prompt_field: str(item)}
            answer = answer_of(i)
            if answer is not None:
                row[d.answer_field] = answer
            rows.append(row)
    except DatasetError:
        raise
    except Exception as e:
        raise DatasetError(f"{where} failed: {type(e).__name__}: {e}") from e
    return rows


MESSAGES = "messages"  # a dataset class's chat item becomes this row field


def load_rows(settings: PromptSettings, tokenizer: Any = None, where: str = "spec.dataset",
              limit: Optional[int] = None) -> list[dict[str, Any]]:
    """The dataset's rows as dicts (`where`: the field errors name; limit: the first rows only)."""
    d = settings.dataset
    if d.class_:
        return _class_rows(settings, tokenizer, where)
    if d.factory:
        factory = DATASETS.get(d.factory) or plugins.resolve(d.factory)
        why = check_factory(factory)
        if why:
            raise DatasetError(f"{where}.factory '{d.factory}' {why}")
        what = f"{where}.factory '{d.factory}'"
        try:
            return _rows_of(factory(**d.args), what)
        except DatasetError:
            raise
        except Exception as e:
            raise DatasetError(f"{what} failed: {type(e).__name__}: {e}") from e
    assert d.path is not None
    fmt = None if data_url.is_url(d.path) else _local_format(d, where)
    if fmt == "jsonl":  # a local jsonl file read here: errors name the line
        rows = []
        for n, line in enumerate(Path(d.path).read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{where}.path: {d.path}:{n}: not JSON: {e}") from None
        return rows[:limit]
    try:  # streaming: only the rows asked for are read (an evaluation set's maxPrompts)
        ds = sources.open_dataset(d, where, streaming=d.streaming)
        return [dict(r) for r in itertools.islice(ds, limit)]
    except sources.SourceError as e:
        raise DatasetError(str(e)) from e
    except Exception as e:  # noqa: BLE001 - a streamed source fails while it is read
        raise DatasetError(str(sources.explain(e, d.path, where))) from e


def _local_format(d: DatasetSpec, where: str) -> Optional[str]:
    """A single local file's format (None: a glob, a directory or a missing file: sources says)."""
    if glob.has_magic(d.path) or not Path(d.path).is_file():
        return None
    try:
        return sources.file_format(d, d.path, where)
    except sources.SourceError as e:
        raise DatasetError(str(e)) from e


def messages_field(d: DatasetSpec, row: dict[str, Any]) -> Optional[str]:
    """The row field holding chat messages: messagesField, or a dataset class's chat item."""
    return d.messages_field or (MESSAGES if d.class_ and d.prompt_field not in row else None)


def render_prompt(settings: PromptSettings, tokenizer: Any, row: dict[str, Any], index: int,
                  where: str = "spec.dataset") -> str:
    d = settings.dataset
    field_name = messages_field(d, row)
    if field_name:
        messages = row.get(field_name)
        if not isinstance(messages, list):
            raise DatasetError(f"dataset row {index} has no list field '{field_name}' "
                               f"({where}.messagesField)")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if d.factory in CHAT_ROWS and settings.chat_template and isinstance(row.get(MESSAGES), list):
        return tokenizer.apply_chat_template(row[MESSAGES], tokenize=False, add_generation_prompt=True) + \
            str(row.get("prefill") or "")  # the reply's opening (reasoning-gym's prefill)
    if d.prompt_field not in row:
        raise DatasetError(f"dataset row {index} has no field '{d.prompt_field}' ({where}.promptField); "
                           f"it has {sorted(row)}")
    text = str(row[d.prompt_field])
    if d.prompt_template is not None:
        text = d.prompt_template.replace("{prompt}", text)
    if settings.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def to_sample(settings: PromptSettings, tokenizer: Any, row: dict[str, Any], index: int,
              where: str = "spec.dataset", seq: int = -1) -> Optional[Sample]:
    """One row rendered and tokenized; None when its prompt is over maxPromptLength."""
    d = settings.dataset
    text = render_prompt(settings, tokenizer, row, index, where)
    templated = bool(messages_field(d, row) or settings.chat_template)
    ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    if len(ids) > d.max_prompt_length:
        return None
    if d.answer_field != "answer" and d.answer_field in row:
        row = {**row, "answer": row[d.answer_field]}  # rewards read `answer`
    return Sample(index=index, prompt=text, prompt_ids=list(ids), row=row, seq=seq)


def load_samples(settings: PromptSettings, tokenizer: Any, where: str = "spec.dataset",
                 limit: Optional[int] = None) -> list[Sample]:
    """Every usable row (limit: of the first rows), rendered and tokenized; prompts over
    maxPromptLength are dropped."""
    rows = load_rows(settings, tokenizer, where, limit)
    if not rows:
        d = settings.dataset
        raise DatasetError(f"{where}.path: '{d.path}' holds no rows (an empty file) -- write the rows to it, or point "
                           f"{where}.path at the file that holds them" if d.path else
                           f"{where}: the dataset gave no rows -- check {where}.factory or {where}.class and its args")
    samples = [s for s in (to_sample(settings, tokenizer, row, i, where) for i, row in enumerate(rows))
               if s is not None]
    dropped = len(rows) - len(samples)
    if dropped:
        log.info("dropped prompts longer than maxPromptLength", extra={"dropped": dropped, "kept": len(samples)})
    if not samples:
        raise DatasetError(f"no usable prompts: {len(rows)} rows, {dropped} longer than "
                           f"{where}.maxPromptLength ({settings.dataset.max_prompt_length})")
    return samples


class PromptStream:
    """The job's prompts as one endless stream in a seeded per-epoch order (rank 0's rollout
    manager owns it). Each sample carries `seq`, its position in the stream (epoch x rows +
    position), which names it in checkpoints and seeds its sampling; `sample_at(seq)` rebuilds
    any sample of the stream, so prompts issued but not trained when a checkpoint is taken are
    generated again after a resume, neither skipped nor trained twice."""

    def __init__(self, settings: PromptSettings, tokenizer: Any, samples: list[Sample] | None = None):
        self.samples = samples if samples is not None else load_samples(settings, tokenizer)
        self.shuffle, self.seed = settings.dataset.shuffle, settings.seed
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
        if state.get("streaming"):
            raise DatasetError("spec.dataset.streaming: the checkpoint was written by a run that streamed the "
                               "dataset; resume it with streaming true (or start a new run)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
