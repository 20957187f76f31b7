"""RolloutManager: keeps generation going for the trainer, within the staleness bound.

    manager = RolloutManager(client, workflow, samples=stream, max_staleness=s)
    groups = manager.next_groups(k)            # blocking; k groups from the sample stream
    groups = manager.next_groups(samples, v)   # or: exactly these samples at policy version v
    manager.set_policy_version(v)              # after each weight push
    manager.close()

The second form is the trainer loop's `GroupSource.next_groups(samples, policy_version)`.

The manager runs an asyncio loop in a background thread; workflows run there concurrently (up
to `max_concurrency` groups). Each group's version is the oldest policy version among its
completions. Rule: a group is returned only if current - version <= max_staleness, and every
generate call asks the servers for at least version current - max_staleness (`min_version`), so
a server that has not received the newest push yet does not answer with an older policy.
- max_staleness 0: generation happens on demand (k groups per call) at the current version;
  a group that comes back older (the version moved while it ran) is generated again.
- max_staleness s > 0: generation runs ahead of the trainer by up to s steps' worth of groups
  (s x the largest k asked for, or `groups_per_step`); groups that became too old while waiting
  are dropped and their samples generated again.
`samples` is an iterator/iterable of Sample or a callable returning a list of Samples (called
again whenever the previous list is used up); it is only touched from the manager's thread.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import logging
import threading
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from .client import RolloutError
from .types import Generator, Group, Sample, Workflow

log = logging.getLogger("grpojob.rollout.manager")

SampleSource = Union[Callable[[], Sequence[Sample]], Iterable[Sample], None]


class _AtLeast:
    """The client as a workflow sees it: every call asks for at least the staleness floor."""

    def __init__(self, client: Generator, floor: Callable[[], int]):
        self.client = client
        self.floor = floor
        params = inspect.signature(client.generate).parameters
        self._takes_floor = "min_version" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())

    async def generate(self, prompt_ids, n, sampling):
        if self._takes_floor:
            return await self.client.generate(prompt_ids, n, sampling, min_version=self.floor())
        return await self.client.generate(prompt_ids, n, sampling)


class RolloutManager:
    def __init__(self, client: Generator, workflow: Workflow, samples: SampleSource = None,
                 max_staleness: int = 0, *, policy_version: int = 0, groups_per_step: Optional[int] = None,
                 max_concurrency: int = 256, timeout: float = 3600.0):
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.client = client
        self.workflow = workflow
        self.max_staleness = max_staleness
        self.version = policy_version
        self.groups_per_step = groups_per_step
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self._factory = samples if callable(samples) and not hasattr(samples, "__next__") else None
        self._iter: Optional[Iterator[Sample]] = None if self._factory or samples is None else iter(samples)
        self._gen = _AtLeast(client, lambda: self.version - self.max_staleness)
        self._ready: collections.deque[tuple[int, Group]] = collections.deque()
        self._requeue: collections.deque[Sample] = collections.deque()
        self._inflight: set[asyncio.Task] = set()
        self._demand = 0
        self._error: Optional[BaseException] = None
        self._exhausted = False
        self.stats = {"groups": 0, "stale_dropped": 0}
        self._loop = asyncio.new_event_loop()
        self._changed: Optional[asyncio.Condition] = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpojob-rollout-manager",
                                        daemon=True)
        self._thread.start()
        self._call(self._init())

    async def _init(self) -> None:
        self._changed = asyncio.Condition()

    # ---- public (any thread) ---------------------------------------------------------------------
    def next_groups(self, k: Union[int, Sequence[Sample]], policy_version: Optional[int] = None) -> list[Group]:
        """k groups from the sample stream, or one group per given sample (in order)."""
        if policy_version is not None:
            self.set_policy_version(policy_version)
        if isinstance(k, int):
            return self._call(self._take(k))
        return self._call(self._for_samples(list(k)))

    def set_policy_version(self, version: int) -> None:
        self._loop.call_soon_threadsafe(self._on_version, version)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._shutdown(), timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> "RolloutManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, coro, timeout: Optional[float] = None):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout if timeout is not None else self.timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RolloutError(f"rollouts did not produce the groups within {self.timeout:.0f} s "
                               f"({len(self._inflight)} in flight, {len(self._ready)} ready)") from None

    # ---- loop side ----------------------------------------------------------------------------------
    def _on_version(self, version: int) -> None:
        self.version = version
        keep = collections.deque()
        for v, g in self._ready:
            if self._fresh(v):
                keep.append((v, g))
            else:
                self.stats["stale_dropped"] += 1
                self._requeue.append(g.sample)
        self._ready = keep
        self._fill()

    def _fresh(self, version: int) -> bool:
        return self.version - version <= self.max_staleness

    def _next_sample(self) -> Optional[Sample]:
        if self._requeue:
            return self._requeue.popleft()
        for _ in range(2):
            if self._iter is not None:
                try:
                    return next(self._iter)
                except StopIteration:
                    self._iter = None
            if self._factory is None:
                break
            self._iter = iter(self._factory())
        self._exhausted = True
        return None

    def _fill(self) -> None:
        """Start workflows until demand (plus the allowed look-ahead) is covered."""
        ahead = (self.groups_per_step or 0) * self.max_staleness
        while (len(self._inflight) + len(self._ready) < self._demand + ahead
               and len(self._inflight) < self.max_concurrency):
            sample = self._next_sample()
            if sample is None:
                break
            self._start(sample, into_ready=True)

    def _start(self, sample: Sample, into_ready: bool) -> asyncio.Task:
        task = asyncio.ensure_future(self._one(sample, into_ready))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def _one(self, sample: Sample, into_ready: bool) -> Optional[Group]:
        """Run the workflow until its group is fresh enough; into_ready: hand it to the queue."""
        try:
            while True:
                group = await self.workflow.run(self._gen, sample)
                if not group.completions:
                    raise RolloutError(f"workflow returned no completions for sample {sample.index}")
                version = min(c.policy_version for c in group.completions)
                if self._fresh(version):
                    break
                self.stats["stale_dropped"] += 1
                log.info("group of sample %d came back at version %d (current %d): generating it again",
                         sample.index, version, self.version)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = e if isinstance(e, RolloutError) else RolloutError(
                f"workflow {type(self.workflow).__name__} failed on sample {sample.index}: "
                f"{type(e).__name__}: {e}")
            if not into_ready:
                raise err from e
            self._requeue.appendleft(sample)  # not lost: the next call tries it again
            self._error = err
            await self._notify()
            return None
        self.stats["groups"] += 1
        if into_ready:
            self._ready.append((version, group))
            await self._notify()
            self._fill()
        return group

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _take(self, k: int) -> list[Group]:
        if k <= 0:
            return []
        self.groups_per_step = max(self.groups_per_step or 0, k)
        self._demand += k
        try:
            self._fill()
            async with self._changed:
                while len(self._ready) < k:
                    if self._error is not None:
                        err, self._error = self._error, None
                        raise err
                    if self._exhausted and not self._inflight and not self._requeue:
                        raise RolloutError(f"the sample source is exhausted ({len(self._ready)} of {k} "
                                           f"groups ready)")
                    await self._changed.wait()
            taken = [self._ready.popleft()[1] for _ in range(k)]
            return sorted(taken, key=lambda g: g.sample.index)  # completion order is not reproducible
        finally:
            self._demand -= k
            self._fill()

    async def _for_samples(self, samples: list[Sample]) -> list[Group]:
        tasks = [self._start(s, into_ready=False) for s in samples]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            raise

    async def _shutdown(self) -> None:
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        close = getattr(self.client, "close", None)
        if close is not None and inspect.iscoroutinefunction(close):
            await close()
