"""The trainer's rollout side: where each step's groups come from and where new weights go.

    rollouts = wiring.connect(job, tokenizer, env, kind="remote", listen_host=..., resumed=False)
    step = rollouts.source.next_step()              # every rank: its share of the step's groups
    report = rollouts.publisher.publish(named, v)    # rank 0 (None elsewhere)
    rollouts.source.set_published(v)
    rollouts.close()

Rank 0 runs the RolloutManager (it owns the prompt stream, generates ahead within maxStaleness,
scores, refills dynamic sampling) and hands every rank its share of each step's groups.
kind "remote": the rollout servers registered with the weight-sync store hosted on rank 0 (the
plan's pods and `grpojob run`); kind "inprocess": a transformers engine inside rank 0 (the
trainer alone: its own tests, debugging). Both go through the same manager and the same loop.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Protocol

import torch

from grpojob.leader.manager import RolloutManager, StepGroups
from grpojob.contracts.rollout import Completion, Generator, SamplingParams
from grpojob.sync.stream import TensorStream
from grpojob.learner import dist

log = logging.getLogger("grpojob.leader.rollouts")

KINDS = ("remote", "inprocess")


@dataclass
class PushReport:
    """What one weight push did."""
    version: int
    seconds: float
    backend: Optional[str]  # the path(s) it took (nccl, cuda-ipc, shm, gloo, checkpoint, inprocess)
    servers: int = 0
    paused_seconds: Optional[float] = None  # generation stopped for it (longest over servers)
    dropped: tuple[str, ...] = ()
    bytes: Optional[int] = None  # tensor bytes pushed (LoRA: the adapter's only)
    tensors: Optional[int] = None  # tensors pushed
    adapter: bool = False  # a LoRA adapter, not full weights


class WeightPublisher(Protocol):
    """Rank 0's way to the rollout engines: a full Hugging Face-named state dict as `version`."""
    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> PushReport: ...

    def servers(self) -> list[dict[str, Any]]:
        """Every rollout server: {replica, version}."""
        ...

    def close(self) -> None: ...


class GroupSource:
    """Every rank's view of rank 0's RolloutManager. Collective calls: next_step."""

    def __init__(self, env: dist.DistEnv, manager: Optional[RolloutManager]):
        assert (manager is not None) == env.is_leader, "the manager lives on rank 0, only there"
        self.env, self.manager = env, manager

    def start(self) -> None:
        if self.manager is not None:
            self.manager.start()

    def next_step(self, stop: Optional[threading.Event] = None) -> Optional[StepGroups]:
        """This rank's share of the step's groups (round-robin in stream order), with the step's
        pipeline figures (the same on every rank). None on every rank when rank 0's `stop` was set
        while the groups were not all there (the step is given up, nothing is lost)."""
        step = self.manager.next_step(stop) if self.manager is not None else None
        if self.env.world == 1:
            return step
        shares = None
        if self.manager is not None:
            shares = [None if step is None else dataclasses.replace(step, groups=step.groups[r::self.env.world])
                      for r in range(self.env.world)]
        return dist.scatter_objects(shares, self.env)

    def set_published(self, version: int) -> None:
        if self.manager is not None:
            self.manager.set_published(version)

    def state_dict(self) -> dict[str, Any]:
        """Rank 0: the data position and the prompts issued but not trained ({} elsewhere)."""
        return self.manager.state_dict() if self.manager is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.manager is not None and state:
            self.manager.load_state_dict(state)

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


@dataclass
class Rollouts:
    source: GroupSource
    publisher: Optional[WeightPublisher]  # rank 0
    engine_close: Optional[Any] = None  # a coroutine function closing the generator, run on the manager's loop
    generator: Optional[Generator] = None  # rank 0: what the manager generates with
    evaluation: Optional[Any] = None  # rank 0: grpojob.leader.evaluation.evaluator.Evaluation (spec.evaluation)
    turns: Optional[Any] = None  # rank 0, spec.placement colocated: trainer.turns.EngineTurns

    def sample(self, prompt_ids: list[int], n: int, sampling: SamplingParams, *, min_version: Optional[int],
               timeout: float) -> list[Completion]:
        """Rank 0: `n` completions of a prompt outside the prompt stream (the training service's
        sample), on the manager's loop, from servers holding at least `min_version`."""
        assert self.generator is not None and self.source.manager is not None, "rank 0 only"
        return self.source.manager.run(self.generator.generate(prompt_ids, n, sampling, min_version=min_version),
                                       timeout=timeout)

    def close(self) -> None:
        if self.evaluation is not None:
            self.evaluation.close()
        if self.engine_close is not None and self.source.manager is not None:
            self.source.manager.run(self.engine_close())
        self.source.close()
        if self.publisher is not None:
            self.publisher.close()


# ---- in-process: a transformers engine inside rank 0 -------------------------------------------------
class EngineGenerator:
    """An engine as the manager's generator. The engine always holds the newest pushed version
    (pushes load synchronously), so the version floor is always met."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams, *,
                       min_version: Optional[int] = None) -> list[Completion]:
        return await self.engine.generate(prompt_ids, n, sampling)


class EnginePublisher:
    """Loads pushed weights straight into the in-process engine."""
    backend = "inprocess"

    def __init__(self, engine):
        self.engine = engine

    def publish(self, named_tensors, version: int) -> PushReport:
        t0 = time.perf_counter()
        config = named_tensors.adapter if isinstance(named_tensors, TensorStream) else None  # LoRA: the adapter
        named = [(n, t.detach()) for n, t in named_tensors]
        if config is not None:
            self.engine.load_adapter(named, config, version, f"inprocess-{version}")
        else:
            self.engine.load(named, version, f"inprocess-{version}")
        return PushReport(version=version, seconds=time.perf_counter() - t0, backend=self.backend, servers=1,
                          paused_seconds=self.engine.last_pause_seconds, tensors=len(named),
                          bytes=sum(t.numel() * t.element_size() for _, t in named), adapter=config is not None)

    def servers(self) -> list[dict[str, Any]]:
        return [{"replica": "in-process", "version": self.engine.version}]

    def close(self) -> None:
        pass
