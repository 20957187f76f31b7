"""spec.dataset.streaming: the prompt stream of a dataset read lazily (a `datasets.IterableDataset`
over local files, object-store or web URLs, or the Hub), for datasets too large to hold in memory.

    stream = StreamingPrompts(PromptSettings.of(spec), tokenizer)   # opens the source, reads its first row: errors now
    sample = stream.next()                        # one row's prompt, rendered and tokenized
    state = stream.state_dict()                   # into the checkpoint
    stream.load_state_dict(state)                 # a resumed run goes on where it stopped

Shuffling. Rows pass through a buffer of spec.dataset.shuffleBuffer rows; each draw takes the row
at an index seeded by (training.seed, epoch, draw number), so the order is reproducible. Each
epoch reads the source again in its own order with a fresh draw sequence. (datasets' own
`shuffle(buffer_size=...)` is not used: its state_dict does not keep the buffer, so a resumed run
would lose the rows it held.)

Checkpoint. The state holds the source's position (`IterableDataset.state_dict()`: its shard and
row), the rows in the shuffle buffer, the draw count, and the rows of the last prompts issued (the
rollout manager asks `sample_at(seq)` for those issued but not trained when it resumes). A resumed
run reads no row it already drew: the row index of each sample (`Sample.index`, its position in
the source's order) shows it. `datasets` resumes inside a file by reading it from its start up to
the saved row (those rows are skipped, not used)."""
from __future__ import annotations

import atexit
import json
import logging
import random
from collections import OrderedDict
from typing import Any, Iterator, Optional

from grpojob.contracts.rollout import Sample
from grpojob.data import DatasetError, PromptSettings, PromptStream, sources, to_sample

log = logging.getLogger("grpojob.data")

FORMAT = 1  # of state_dict


class StreamingPrompts:
    def __init__(self, settings: PromptSettings, tokenizer: Any, where: str = "spec.dataset", source: Any = None):
        self.settings, self.tokenizer, self.where = settings, tokenizer, where
        d = settings.dataset
        self.buffer_size = d.shuffle_buffer if d.shuffle else 1
        self.seed = settings.seed
        self.window = settings.keep  # issued prompts held (by seq) for sample_at
        try:
            self.source = source if source is not None else sources.open_dataset(d, where, streaming=True)
        except sources.SourceError as e:
            raise DatasetError(str(e)) from e
        self.epoch = 0
        self.seq = 0  # the next sample's position in the stream
        self.read = 0  # rows read from the source this epoch (the next one's index)
        self.drawn = 0  # draws from the buffer this epoch
        self.usable = 0  # samples issued this epoch (0 at the end of one: nothing usable)
        self.dropped = 0  # rows over maxPromptLength, in all
        self._buffer: list[tuple[int, dict[str, Any]]] = []  # (row index, row)
        self._issued: OrderedDict[int, tuple[int, dict[str, Any]]] = OrderedDict()  # seq -> (index, row)
        self._it: Optional[Iterator[dict[str, Any]]] = None
        self._exhausted = False
        atexit.register(self.close)  # before the interpreter tears down what the reader's cleanup needs
        self._fill(upto=1)  # a missing object, bad credentials or an unreadable file fail at the trainer's start
        if not self._buffer:
            raise DatasetError(f"{where}.path: '{d.path}' holds no rows (an empty file) -- write the rows to it, or "
                               f"point {where}.path at the file that holds them")

    # ---- reading ----------------------------------------------------------------------------------
    def _fill(self, upto: Optional[int] = None) -> None:
        while not self._exhausted and len(self._buffer) < (upto or self.buffer_size):
            if self._it is None:
                self._it = iter(self.source)
            try:
                row = next(self._it)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as e:  # noqa: BLE001 - the library's error, with the field
                raise DatasetError(str(sources.explain(e, str(self.settings.dataset.path), self.where))) from e
            self._buffer.append((self.read, dict(row)))
            self.read += 1

    def _draw(self) -> tuple[int, dict[str, Any]]:
        k = 0
        if len(self._buffer) > 1 and self.buffer_size > 1:
            k = random.Random(f"{self.seed}/{self.epoch}/{self.drawn}").randrange(len(self._buffer))
        self.drawn += 1
        self._buffer[k], self._buffer[-1] = self._buffer[-1], self._buffer[k]
        return self._buffer.pop()

    def _new_epoch(self) -> None:
        if self.usable == 0:
            raise DatasetError(f"no usable prompts: {self.read} rows, {self.dropped} longer than "
                               f"{self.where}.maxPromptLength ({self.settings.dataset.max_prompt_length})")
        self.epoch += 1
        self.read = self.drawn = self.usable = 0
        self._exhausted = False
        self.source.set_epoch(self.epoch)
        self.close()
        self._it = iter(self.source)  # the source from its start (a fresh iterator has no saved position)
        log.info("dataset stream: epoch %d", self.epoch)

    def _sample(self, index: int, row: dict[str, Any], seq: int) -> Optional[Sample]:
        return to_sample(self.settings, self.tokenizer, row, index, self.where, seq=seq)

    def close(self) -> None:
        """Stop the source's reader (its files are closed now, not by the garbage collector at exit)."""
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()

    # ---- the Prompts protocol (grpojob.contracts.rollout) ------------------------------------------------
    def next(self) -> Sample:
        while True:
            self._fill()
            if not self._buffer:
                self._new_epoch()
                continue
            index, row = self._draw()
            sample = self._sample(index, row, self.seq)
            if sample is None:
                self.dropped += 1
                continue
            self._issued[self.seq] = (index, row)
            while len(self._issued) > self.window:
                self._issued.popitem(last=False)
            self.seq += 1
            self.usable += 1
            return sample

    def take(self, n: int) -> list[Sample]:
        return [self.next() for _ in range(n)]

    def sample_at(self, seq: int) -> Sample:
        """A sample issued lately, again (those issued but not trained when a checkpoint was taken)."""
        if seq not in self._issued:
            raise DatasetError(f"prompt {seq} of the stream is not held: the stream keeps the last {self.window} "
                               f"issued (from {next(iter(self._issued), self.seq)} to {self.seq - 1})")
        index, row = self._issued[seq]
        sample = self._sample(index, row, seq)
        assert sample is not None, "an issued sample was usable"
        return sample

    def state_dict(self) -> dict[str, Any]:
        """Plain values only (the checkpoint loads with weights_only): rows as JSON text."""
        return {"format": FORMAT, "streaming": True, "epoch": self.epoch, "seq": self.seq, "read": self.read,
                "drawn": self.drawn, "usable": self.usable, "dropped": self.dropped, "exhausted": self._exhausted,
                "source": None if self._exhausted else self.source.state_dict(),
                "buffer": json.dumps(self._buffer, default=str),
                "issued": json.dumps(list(self._issued.items()), default=str)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state.get("streaming"):
            raise DatasetError(f"{self.where}.streaming: the checkpoint was written by a run that read the dataset "
                               f"whole; resume it with streaming false (or start a new run)")
        self.epoch, self.seq, self.read = int(state["epoch"]), int(state["seq"]), int(state["read"])
        self.drawn, self.usable, self.dropped = int(state["drawn"]), int(state["usable"]), int(state["dropped"])
        self._buffer = [(int(i), dict(r)) for i, r in json.loads(state["buffer"])]
        self._issued = OrderedDict((int(s), (int(i), dict(r))) for s, (i, r) in json.loads(state["issued"]))
        self._exhausted = bool(state["exhausted"])
        self.source.set_epoch(self.epoch)
        if not self._exhausted:
            self.source.load_state_dict(state["source"])
        self.close()  # iterated anew from the loaded position


def prompt_stream(settings: PromptSettings, tokenizer: Any):
    """The job's prompt stream: the rows read lazily (spec.dataset.streaming) or all loaded."""
    if settings.dataset.streaming:
        return StreamingPrompts(settings, tokenizer)
    return PromptStream(settings, tokenizer)
