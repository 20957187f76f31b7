"""RolloutManager: rank 0's pipeline from the prompt stream to scored groups, running ahead of
training by up to `algorithm.maxStaleness` policy versions.

    manager = RolloutManager(generator, workflow, scorer, prompts, Pipeline.from_spec(spec), published=v)
    manager.load_state_dict(state)     # after a resume: prompts issued but not trained come first
    manager.start()
    step = manager.next_step()         # blocking: one step's groups, scored, oldest prompts first
    manager.set_published(v)           # after each weight push: the version floor moves
    manager.close()

Versions, run-ahead, dynamic sampling, environments and seeds: docs/architecture.md, "The rollout
manager". An asyncio loop in a background thread runs the workflows (up to `max_concurrency`) and
reward scoring, concurrently with training; a group a workflow rejects (GroupRejected) is dropped
and the next prompt drawn. A step waiting for its groups says what for, and which rollout servers
fail and why (pipeline.WaitReport). `next_step(stop)` gives the step up when `stop` is set (a
suspend while generation is stalled): its groups go back, nothing is lost.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from grpojob.algorithms.shaping import shaped_rewards, zero_variance
from grpojob.leader.trajectories.queue import EnvironmentQueue, Queued, Refused
from grpojob.leader.rollout_client import RolloutError
from grpojob.leader.pipeline import (WAIT_CHECK_SECONDS, IdleClock, Pipeline, SampleClient, StepGroups, WaitReport, derive_seed, group_version)
from grpojob.contracts.rollout import Generator, Group, GroupRejected, Prompts, Sample, Scorer, Workflow
from grpojob.rewards.judges import GroupSkipped

__all__ = ["Pipeline", "RolloutManager", "StepGroups", "derive_seed", "group_version"]

log = logging.getLogger("grpojob.leader.manager")


@dataclass(order=True)
class _Ready:
    seq: int
    version: int = field(compare=False)
    group: Group = field(compare=False)
    score_seconds: float = field(compare=False, default=0.0)
    submitted: Optional[Queued] = field(compare=False, default=None)  # an environment's group


class RolloutManager:
    """workflow None (rollout.workflow none): no prompts, no scorer; every group comes from
    `environments`."""

    def __init__(self, generator: Optional[Generator], workflow: Optional[Workflow], scorer: Optional[Scorer],
                 prompts: Optional[Prompts], pipeline: Pipeline, *, published: int = 0, taken: int = 0,
                 environments: Optional[EnvironmentQueue] = None,
                 health: Optional[Callable[[], Optional[str]]] = None,
                 on_wait: Optional[Callable[[str], None]] = None):
        """health, on_wait: see pipeline.WaitReport."""
        self.generator, self.workflow, self.scorer, self.prompts = generator, workflow, scorer, prompts
        self._wait = WaitReport(health, on_wait)
        self.pipeline = pipeline
        self.environments = environments or EnvironmentQueue(pipeline.prompts_per_step, pipeline.queue_limit)
        # Groups per step the environments' commitments held when the step being taken began (None
        # between steps: the commitments as they are). The workflow generates the rest.
        self._step_reserved: Optional[int] = None
        self._waiting = ""  # what the step being taken waits for (in words, for logs and timeouts)
        self.published = published
        self.taken = taken  # steps handed to the trainer
        self._ready: list[_Ready] = []  # heap by stream position
        self._inflight: dict[int, asyncio.Task] = {}
        self._requeue: list[tuple[int, Sample]] = []  # heap: prompts to generate (again), oldest first
        self._attempts: dict[int, int] = {}
        self._considered = 0  # groups the step being taken has consumed so far
        self._extra = 0  # dynamic-sampling refills that step asks for
        self._stale = 0
        self._error: Optional[BaseException] = None
        self._started = False
        self._idle = IdleClock()  # the share of each step's wait with nothing generating
        self._loop = asyncio.new_event_loop()
        self._changed: Optional[asyncio.Condition] = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpojob-rollout-manager",
                                        daemon=True)
        self._thread.start()
        self.run(self._init())

    async def _init(self) -> None:
        self._changed = asyncio.Condition()

    # ---- public (any thread) ---------------------------------------------------------------------
    def start(self) -> None:
        """Begin generating (after load_state_dict, when resuming)."""
        self._loop.call_soon_threadsafe(self._begin)

    def next_step(self, stop: Optional[threading.Event] = None) -> Optional[StepGroups]:
        """The next step's groups; None when `stop` was set before they were all there."""
        fut = asyncio.run_coroutine_threadsafe(self._take(), self._loop)
        end = time.monotonic() + self.pipeline.timeout
        while True:
            try:
                return fut.result(min(0.25, max(0.0, end - time.monotonic())))
            except concurrent.futures.TimeoutError:
                pass
            except Exception:  # noqa: BLE001 - the servers stopping with us is no failure of a suspend
                if stop is None or not stop.is_set():
                    raise
            given_up = stop is not None and stop.is_set()
            if given_up or time.monotonic() >= end:
                waiting = self._waiting  # before the cancelled step clears it
                fut.cancel()  # _take puts back what it took
                if not given_up:
                    raise self._timed_out(self.pipeline.timeout, waiting)
                log.info("step %d given up while waiting for its groups (stop requested)", self.taken + 1)
                return None

    def ahead(self) -> tuple[int, int]:
        """(samples being generated, groups ready) now, for progress and benchmarks."""
        return len(self._inflight), len(self._ready)

    def set_published(self, version: int) -> None:
        self._loop.call_soon_threadsafe(self._on_published, version)

    def state_dict(self) -> dict[str, Any]:
        """The stream position and every prompt issued but not yet trained on (oldest first)."""
        return self.run(self._state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run(self._load(state))

    def spawn(self, coro) -> concurrent.futures.Future:
        """Run a coroutine on the manager's loop in the background (the evaluation: its own prompts,
        the same generator); the future's cancel() cancels it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro, timeout: Optional[float] = 600.0):
        """Run a coroutine on the manager's loop (also how an in-process engine is started there)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            waiting = self._waiting  # before the cancelled step clears it
            fut.cancel()
            raise self._timed_out(timeout, waiting) from None

    def _timed_out(self, timeout: float, waiting: str) -> RolloutError:
        return RolloutError(f"rollouts did not produce the step's groups within {timeout:.0f} s "
                            f"({len(self._inflight)} generating, {len(self._ready)} ready"
                            + (f"; waiting for {waiting}" if waiting else "") + ")")

    # ---- environments (the trajectory API's handlers, any thread) -----------------------------------
    def register(self, name: str, groups_per_step: Optional[int]) -> dict[str, Any]:
        return self.run(self._register(name, groups_per_step), timeout=30)

    def submit(self, name: str, groups: list[Group]) -> int:
        """Queue an environment's scored groups (all or none); raises trajectories.Refused."""
        return self.run(self._submit(name, groups), timeout=30)

    def count_refused(self, name: Optional[str], reason: str, n: int) -> None:
        self._loop.call_soon_threadsafe(self.environments.count_refused, name, reason, n)

    def environment_status(self) -> dict[str, Any]:
        return self.run(self._environment_status(), timeout=30)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self._shutdown(), timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> "RolloutManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- loop side ----------------------------------------------------------------------------------
    def _floor(self) -> int:
        return self.published - self.pipeline.max_staleness

    def _begin(self) -> None:
        self._started = True
        self._fill()

    def _on_published(self, version: int) -> None:
        self.published = version
        self.environments.drop_stale(self._floor())
        keep = []
        for r in self._ready:
            if r.version >= self._floor():
                keep.append(r)
            else:
                self._stale += 1
                heapq.heappush(self._requeue, (r.seq, r.group.sample))
        if len(keep) != len(self._ready):
            heapq.heapify(keep)
            self._ready = keep
        self._fill()

    def _wanted(self) -> int:
        """Groups that should be ready or generating now."""
        p = self.pipeline
        reserved = self._step_reserved
        if reserved is None:
            reserved = sum(self.environments.quotas().values())
        share = max(0, p.prompts_per_step - reserved)  # what environments' commitments leave
        return p.steps_ahead(self.taken, self.published) * share - self._considered + self._extra

    def _fill(self) -> None:
        if not self._started or self._error is not None or self.workflow is None:
            return
        while (len(self._inflight) + len(self._ready) < self._wanted()
               and len(self._inflight) < self.pipeline.max_concurrency):
            sample = heapq.heappop(self._requeue)[1] if self._requeue else self.prompts.next()
            if not self._inflight:
                self._idle.busy()
            task = asyncio.ensure_future(self._one(sample))
            self._inflight[sample.seq] = task
            task.add_done_callback(lambda _t, seq=sample.seq: self._release(seq))  # also when cancelled

    def _release(self, seq: int) -> None:
        """A sample's generation ended: its slot is free (before its group is handed on, so the
        next fill counts it as ready, not as in flight)."""
        if self._inflight.pop(seq, None) is not None and not self._inflight:
            self._idle.idle()

    async def _one(self, sample: Sample) -> None:
        """Generate and score one sample's group until it is fresh enough, then make it ready."""
        try:
            while True:
                attempt = self._attempts.get(sample.seq, 0)
                self._attempts[sample.seq] = attempt + 1
                client = SampleClient(self.generator, self._floor,
                                      derive_seed(self.pipeline.seed, sample.seq, attempt))
                group = await self.workflow.run(client, sample)
                if not group.completions:
                    raise RolloutError(f"workflow returned no completions for sample {sample.index}")
                version = group_version(group)
                if version >= self._floor():
                    break
                self._stale += 1
                log.info("group of sample %d came back at version %d (floor %d): generating it again",
                         sample.index, version, self._floor())
        except asyncio.CancelledError:
            raise
        except GroupRejected as e:  # dropped by the workflow's own filter: the next prompt takes its place
            log.info("sample %d: the workflow rejected its group (%s)", sample.index, e)
            self._attempts.pop(sample.seq, None), self._release(sample.seq)
            return self._fill()
        except Exception as e:
            err = e if isinstance(e, RolloutError) else RolloutError(
                f"workflow {type(self.workflow).__name__} failed on sample {sample.index}: "
                f"{type(e).__name__}: {e}")
            return await self._failed(sample, err)
        t0 = time.perf_counter()
        try:
            await self.scorer.score_group(group)
        except Exception as e:  # the reward's own error names it (spec.rewards[i])
            return await self._failed(sample, e)
        scored = time.perf_counter() - t0
        self._attempts.pop(sample.seq, None)
        self._release(sample.seq)
        heapq.heappush(self._ready, _Ready(sample.seq, version, group, scored))
        await self._notify()
        self._fill()

    async def _failed(self, sample: Sample, err: BaseException) -> None:
        self._release(sample.seq)
        heapq.heappush(self._requeue, (sample.seq, sample))  # not lost: a retry generates it again
        if isinstance(err, GroupSkipped):  # a judge's onFailure skip: no error, generated again once this task
            asyncio.current_task().add_done_callback(lambda _t: self._fill())  # has left _inflight
        else:
            self._error = err
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _zero_variance(self, group: Group) -> bool:
        p = self.pipeline
        return zero_variance(shaped_rewards(group, p.overlong, p.max_tokens))

    async def _take(self) -> StepGroups:
        p = self.pipeline
        t0 = time.monotonic()
        budget = max(p.prompts_per_step, int(p.prompts_per_step * p.max_resample_factor)) \
            if p.dynamic_sampling else p.prompts_per_step
        taken: list[_Ready] = []
        kept = 0
        owed = self.environments.quotas()  # this step waits for these environments' groups
        self._step_reserved = sum(owed.values())
        if not self._started:
            self._begin()
        try:
            while kept < p.prompts_per_step and len(taken) < budget:
                want = min(p.prompts_per_step - kept, budget - len(taken))
                self._extra = max(0, len(taken) + want - p.prompts_per_step)
                self._fill()
                before = len(taken)
                await self._gather(taken, want, owed, t0)
                kept += sum(not (p.dynamic_sampling and self._zero_variance(r.group)) for r in taken[before:])
        except BaseException:
            for r in taken:  # nothing is lost: a failed step's groups go back (stream order)
                if r.submitted is None:
                    heapq.heappush(self._ready, r)
            self.environments.put_back([r.submitted for r in taken if r.submitted is not None])
            raise
        finally:
            self._considered = self._extra = 0
            self._waiting, self._step_reserved = "", None
            self._wait.done()
        self.taken += 1
        now, idle = time.monotonic(), self._idle.fraction()
        stale, self._stale = self._stale, 0
        self._fill()
        per_env, parts = self.environments.trained([r.submitted for r in taken if r.submitted is not None])
        return StepGroups(groups=[r.group for r in taken], wait_seconds=now - t0,
                          score_seconds=sum(r.score_seconds for r in taken),
                          idle_fraction=idle if self.workflow is not None else None,
                          in_flight=len(self._inflight) + len(self._ready) + self.environments.queued(),
                          resampled=max(0, len(taken) - p.prompts_per_step), stale=stale,
                          sample_ids=[r.group.sample.index for r in taken if r.submitted is None],
                          from_environments=sum(r.submitted is not None for r in taken), environments=per_env,
                          environment_rewards=parts)

    async def _gather(self, taken: list[_Ready], want: int, owed: dict[str, int], since: float) -> None:
        """Append `want` groups to `taken`: environments' commitments first, then queued groups of
        any environment, then the workflow's (stream order); wait for what is missing."""
        need = len(taken) + want
        async with self._changed:
            while True:
                n = need - len(taken)
                picked = [_Ready(-1, q.version, q.group, submitted=q) for q in self.environments.take_owed(owed, n)]
                room = n - len(picked) - sum(owed.values())
                if room > 0:
                    picked += [_Ready(-1, q.version, q.group, submitted=q) for q in self.environments.take_any(room)]
                    room = n - len(picked) - sum(owed.values())
                if 0 < room <= len(self._ready):  # all at once: the stream's oldest, whatever finished first
                    picked += [heapq.heappop(self._ready) for _ in range(room)]
                    self._considered += room
                taken += picked
                if len(taken) >= need:
                    return
                if self._error is not None:
                    err, self._error = self._error, None
                    raise err
                what = self.environments.waiting_for(owed, need - len(taken), self.workflow is not None)
                self._waiting = self._wait.describe(what)
                try:
                    await asyncio.wait_for(self._changed.wait(), WAIT_CHECK_SECONDS)
                except asyncio.TimeoutError:
                    self._waiting = self._wait.describe(what)  # the servers' health now
                    self._wait.waited(self.taken + 1, time.monotonic() - since, self._waiting)

    async def _register(self, name: str, groups_per_step: Optional[int]) -> dict[str, Any]:
        reg = self.environments.register(name, groups_per_step)
        log.info("environment %s registered (%s groups per step)", name, groups_per_step or "no commitment")
        await self._notify()
        return {"name": reg.name, "groups_per_step": reg.groups_per_step, **self._versions()}

    async def _submit(self, name: str, groups: list[Group]) -> int:
        if not self._started:
            raise Refused(503, "starting", "the trainer is not taking groups yet (loading, or resuming and "
                          "publishing its weights): retry in a few seconds")
        n = self.environments.submit(name, [(g, group_version(g)) for g in groups], floor=self._floor(),
                                     newest=self.published + self.pipeline.every_steps)
        await self._notify()
        return n

    async def _environment_status(self) -> dict[str, Any]:
        return {**self._versions(), "steps_taken": self.taken, "started": self._started,
                "workflow": self.workflow is not None, "waiting_for": self._waiting or None,
                **self.environments.status()}

    def _versions(self) -> dict[str, Any]:
        return {"published_version": self.published, "version_floor": self._floor(),
                "max_staleness": self.pipeline.max_staleness, "prompts_per_step": self.pipeline.prompts_per_step}

    async def _state(self) -> dict[str, Any]:
        pending = sorted({r.seq for r in self._ready} | set(self._inflight) | {s for s, _ in self._requeue})
        return {"stream": self.prompts.state_dict() if self.prompts is not None else {}, "pending": pending,
                "taken": self.taken, "environments": self.environments.state_dict()}

    async def _load(self, state: dict[str, Any]) -> None:
        assert not self._started, "load_state_dict must come before start()"
        if self.prompts is not None:
            self.prompts.load_state_dict(state["stream"])
            self._requeue = [(seq, self.prompts.sample_at(seq)) for seq in state.get("pending", ())]
            heapq.heapify(self._requeue)
        self.environments.load_state_dict(state.get("environments", {}))
        self.taken = int(state.get("taken", self.taken))

    async def _shutdown(self) -> None:
        for t in list(self._inflight.values()):
            t.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
