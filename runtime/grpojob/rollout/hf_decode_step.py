"""The hf decoder's decode step: its inputs live on the device, and on CUDA it replays as a graph.

Per slot the device holds what a decode step reads: the last token and its position, the noise
key, the token count, temperature / top-p / top-k, and whether the slot holds a row. Rows that
join, leave or move write these (hf_generate.Decoder: admit, _retire); a step reads them and
advances them in place, so a step builds nothing on the host.

A step runs over a bucket of slots 0..B-1 (B: the next power of two >= the active rows, at most
the slots) and attends over kv_len cached positions (the next power of two >= the longest row,
at least KV_MIN, at most the cache). Its shapes depend on the bucket only: rows join and leave
without a new shape. Free slots inside the bucket run along at position 0 of their own (free)
slot; their results are ignored, and an admitted row's prefill overwrites what they wrote.

One device-to-host transfer per step: tokens and log-probs packed in one float64 tensor [2, B]
(exact for any vocabulary index), read once (`Tensor.tolist`). Finish checks (EOS, length) are
made on the host from those tokens, as each row's tokens are appended anyway.

CUDA: each bucket (B, kv_len, the sampling flags of hf_sampling.sample_rows) is captured as a torch.cuda.CUDAGraph the
first time it runs (that step runs eagerly, which is also the capture's warm-up) and replayed
after; the graphs share one memory pool (they run one at a time and each output is read before
the next step). A capture that fails (a model whose forward syncs, say) is logged once and the
decoder runs eagerly from then on. Graphs read weights and KV buffers by address: weight swaps
copy in place (hf_engine._swap), and freeing the KV buffers (sleep) drops the graphs.
GRPOJOB_DECODE_GRAPHS=0 turns capture off. The CPU runs the same step, uncaptured.

CPU threads: a decode step of a small model is hundreds of ops on a few KiB each, and every op
that an intra-op thread team runs pays a fork and join (a wake-up from sleep under the passive
waiting every grpojob process gets): the tiny model's step at 32 rows took 4.8 ms on 2 threads
against about 1.8 ms on 1. A large model's step is the other way round. So the first decode
steps alternate between torch's thread count and one thread (`Threads`); the faster is kept
(for prefills too) until the trial runs again, set on the decoding thread only (the count is per
thread: an in-process trainer keeps its own). GRPOJOB_DECODE_THREADS=N pins N. A compiled step
keeps torch's count (dynamo recompiles when it changes).

Compiled (GRPOJOB_DECODE_COMPILE=1, where no graph is captured: the CPU): the step goes through
torch.compile (inductor: a C++ compiler on the machine) once, with dynamic shapes, so one
compilation serves every bucket (a row count of 1 gets a second). A step of a small model is
hundreds of tiny ops, each costing more to dispatch than to compute; fused, it takes half the
time (benchmarks/generation.py --compile). Off by default: the first step compiles for about a
minute on 2 cores (seconds once torch's compile cache holds it), which only a long run earns
back. A compilation that fails is logged once and the step runs eagerly from then on.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Optional

import torch
from torch import Tensor

from grpojob.devices import intra_op_threads
from grpojob.rollout import hf_attention, hf_sampling

log = logging.getLogger("grpojob.rollout")

KV_MIN = 64  # the smallest attention span a step reads
GRAPHS_ENV = "GRPOJOB_DECODE_GRAPHS"
COMPILE_ENV = "GRPOJOB_DECODE_COMPILE"
THREADS_ENV = "GRPOJOB_DECODE_THREADS"
COMPILE_BACKEND = "inductor"  # tests check dynamo's side with "eager" (no C++ compile in the suite)


def bucket(n: int, cap: int, least: int = 1) -> int:
    """The next power of two >= n (at least `least`), at most `cap`: few shapes, at most 2x work."""
    b = least
    while b < n:
        b *= 2
    return min(b, cap)


class Threads:
    """The intra-op thread count of CPU decode steps: each candidate (torch's count, and one) runs
    TRIALS steps, in turns after a first warm-up step, and the one with the lower median is kept
    for RETRY steps; then the trial runs again (the machine's load changes: on 2 busy cores a
    2-thread step took 3.7-460 ms against 2.5-13 ms on one, and a trial in a bad moment must not
    decide for good)."""
    TRIALS = 4
    RETRY = 512

    def __init__(self, pinned: Optional[int] = None, available: Optional[int] = None):
        n = available or torch.get_num_threads()
        self.options = [pinned] if pinned else sorted({n, 1}, reverse=True)
        self.times: dict[int, list[float]] = {k: [] for k in self.options}
        self.chosen: Optional[int] = self.options[0] if len(self.options) == 1 else None
        self._warm = False
        self._kept = 0  # steps run with `chosen` since the trial
        self._last: Optional[int] = None  # the last trial's choice (a change is logged)

    def next(self) -> int:
        if self.chosen is not None:
            return self.chosen
        return min(self.options, key=lambda k: len(self.times[k]))  # the one with fewer steps timed

    def record(self, threads: int, seconds: float) -> None:
        if self.chosen is not None:
            self._kept += 1
            if len(self.options) > 1 and self._kept >= self.RETRY:
                self.chosen, self._kept = None, 0
                self.times = {k: [] for k in self.options}
            return
        if not self._warm:  # the first step allocates and warms caches: timed for nobody
            self._warm = True
            return
        self.times[threads].append(seconds)
        if all(len(t) >= self.TRIALS for t in self.times.values()):
            med = {k: statistics.median(t) for k, t in self.times.items()}
            last, self.chosen = self._last, min(med, key=med.get)
            self._last = self.chosen
            (log.info if self.chosen != last else log.debug)(
                "hf engine: CPU decode steps run on %d thread(s) (median step: %s)", self.chosen,
                ", ".join(f"{k} thread(s) {1e3 * v:.2f} ms" for k, v in med.items()))

    @classmethod
    def from_env(cls) -> "Threads":
        raw = os.environ.get(THREADS_ENV, "").strip()
        if raw and not (raw.isdecimal() and int(raw) > 0):
            raise ValueError(f"{THREADS_ENV}={raw!r}: a positive number of threads, or unset (measured)")
        return cls(int(raw) if raw else None)


class SlotState:
    """Per-slot decode inputs on the device, written only when rows join, leave or move."""
    LAST, POS, KEY, COUNT, TOP_K = range(5)  # rows of `longs`
    TEMPERATURE, TOP_P = range(2)  # rows of `floats`

    def __init__(self, slots: int, device: torch.device):
        self.device = device
        self.longs = torch.zeros(5, slots, dtype=torch.long, device=device)
        self.floats = torch.ones(2, slots, dtype=torch.float32, device=device)
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)

    def write(self, first: int, rows: list) -> None:
        """Rows (hf_generate.Row, each with its first token) now in slots first, first+1, ..."""
        if not rows:
            return
        at = slice(first, first + len(rows))
        longs = torch.tensor([[r.tokens[-1], r.position, r.key, len(r.tokens), r.sampling.top_k] for r in rows],
                             dtype=torch.long)
        floats = torch.tensor([[r.sampling.temperature, r.sampling.top_p] for r in rows], dtype=torch.float32)
        self.longs[:, at] = longs.T.to(self.device, non_blocking=True)
        self.floats[:, at] = floats.T.to(self.device, non_blocking=True)
        self.active[at] = True

    def move_many(self, src: list[int], dst: list[int]) -> None:
        s, d = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        for buf in (self.longs, self.floats):
            buf[:, d] = buf[:, s]
        self.active[d] = self.active[s]

    def clear_from(self, first: int, end: int) -> None:
        """Slots first..end-1 hold no row."""
        self.active[first:end] = False


class DecodeStep:
    """One decode step of the rows in slots 0..len(rows)-1 (see the module docstring)."""

    def __init__(self, decoder, head, cache: hf_attention.Slots, device: torch.device,
                 graphs: Optional[bool] = None, compiled: Optional[bool] = None):
        self.decoder, self.head, self.cache, self.device = decoder, head, cache, device
        self.state = SlotState(cache.slots, device)
        if graphs is None:
            graphs = os.environ.get(GRAPHS_ENV, "1") != "0"
        self.graphs = graphs and device.type == "cuda"
        if compiled is None:
            compiled = os.environ.get(COMPILE_ENV, "0") == "1"
        self._compiled = (torch.compile(self.run, dynamic=True, fullgraph=True, backend=COMPILE_BACKEND)
                          if compiled and not self.graphs else None)
        self._captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool = None
        # a compiled step keeps the thread count it was compiled with (dynamo guards on it)
        self.threads = Threads.from_env() if device.type == "cpu" and self._compiled is None else None

    def shape(self, rows: list) -> tuple:
        """(bucket rows, kv_len, sampling flags) from what the host knows of the rows."""
        b = bucket(len(rows), self.cache.slots)
        kv_len = bucket(max(r.position for r in rows) + 1, self.cache.max_len, KV_MIN)
        return (b, kv_len, *hf_sampling.flags(r.sampling for r in rows))

    def __call__(self, rows: list) -> tuple[list[float], list[float]]:
        """Tokens (as floats) and log-probs of every row, read in one transfer."""
        shape = self.shape(rows)
        if self.threads is None:
            return self._step(shape)
        k = self.threads.next()
        with intra_op_threads(k):
            start = time.perf_counter()
            try:
                return self._step(shape)
            finally:
                self.threads.record(k, time.perf_counter() - start)

    def prefill_threads(self):
        """A prefill runs with the thread count the decode steps chose (torch's until then)."""
        return intra_op_threads(self.threads.chosen if self.threads is not None else None)

    def _step(self, shape: tuple) -> tuple[list[float], list[float]]:
        if self.graphs:
            packed = self._replay(shape)
        elif self._compiled is not None:
            packed = self._run_compiled(shape)
        else:
            packed = self.run(*shape)
        tokens, logps = packed.tolist()  # the step's one device-to-host transfer
        return tokens, logps

    def run(self, rows: int, kv_len: int, filtered: bool, greedy: bool, tempered: bool) -> Tensor:
        """The step itself, static in shape for given arguments (`shape`): no host sync."""
        st, dev = self.state, self.device
        active = st.active[:rows]
        pos = torch.where(active, st.longs[st.POS, :rows], 0)  # a free slot writes position 0 of its own
        mask = torch.arange(kv_len, device=dev)[None, :] <= pos[:, None]
        step = hf_attention.Step(self.cache, pos, mask[:, None, None], kv_len=kv_len)
        out = self.decoder(input_ids=st.longs[st.LAST, :rows, None], position_ids=pos[:, None],
                           attention_mask=step.mask, use_cache=False, **{hf_attention.KWARG: step})
        logits = self.head(out.last_hidden_state[:, 0]).float()
        count = st.longs[st.COUNT, :rows]
        tokens, logps = hf_sampling.sample_rows(
            logits, st.floats[st.TEMPERATURE, :rows], st.floats[st.TOP_P, :rows], st.longs[st.TOP_K, :rows],
            st.longs[st.KEY, :rows], count, filtered, greedy, tempered)
        # the next step's inputs, in place (a graph replays these writes too)
        last = st.longs[st.LAST, :rows]
        last.copy_(torch.where(active, tokens, last))
        st.longs[st.POS, :rows] += active
        count += active
        return torch.stack([tokens.double(), logps.double()])

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def _run_compiled(self, shape: tuple) -> Tensor:
        try:
            return self._compiled(*shape)
        except Exception as e:  # noqa: BLE001 - compiling fails before the step runs: run it eagerly
            self._compiled = None
            cause = getattr(e, "inner_exception", None) or e  # dynamo wraps a backend's own error
            log.warning("hf engine: compiling the decode step failed (%s: %s); decoding eagerly from now on",
                        type(cause).__name__, " ".join(str(cause).split())[:400])
            return self.run(*shape)

    def _replay(self, shape: tuple) -> Tensor:
        captured = self._captured.get(shape)
        if captured is not None:
            captured[0].replay()
            return captured[1]
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)  # warm-up off the default stream, as torch's docs do it
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out = self.run(*shape)  # this step, eagerly; capturing below only records
        current.wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work (an in-process trainer) does not void the capture
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                static = self.run(*shape)
            self._pool = graph.pool()
            self._captured[shape] = (graph, static)
        except Exception as e:  # noqa: BLE001 - a model that cannot be captured still decodes, eagerly
            self.graphs = False
            self._captured.clear()
            log.warning("hf engine: capturing the decode step as a CUDA graph failed (%s: %s); decoding "
                        "eagerly from now on", type(e).__name__, e)
        return out

    def reset(self) -> None:
        """Drop the graphs (the KV buffers they read are being freed)."""
        self._captured.clear()
        self._pool = None
