"""The rollout pipeline's settings (from the spec), the per-step result handed to the trainer, and
the small rules the RolloutManager applies: derived seeds, group versions, the version floor every
generate call asks for, what a waiting step says."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from grpojob.api.spec import GRPOJobSpec, OverlongSpec
from grpojob.contracts.rollout import Completion, Generator, Group, SamplingParams, derive_seed

log = logging.getLogger("grpojob.leader.manager")

WAIT_LOG_SECONDS = 30.0  # a step still waiting for groups says what for this often
WAIT_CHECK_SECONDS = 5.0  # ... and looks this often whether that changed (a server began to fail)


@dataclass(frozen=True)
class Pipeline:
    """The settings of the pipeline, from the spec."""
    prompts_per_step: int
    total_steps: int
    max_staleness: int = 0
    every_steps: int = 1
    dynamic_sampling: bool = False
    max_resample_factor: float = 1.0
    seed: int = 0
    overlong: OverlongSpec = field(default_factory=OverlongSpec)
    max_tokens: int = 256
    max_concurrency: int = 1024
    timeout: float = 3600.0

    @classmethod
    def from_spec(cls, spec: GRPOJobSpec, **kw: Any) -> "Pipeline":
        a = spec.algorithm
        kw.setdefault("dynamic_sampling", a.dynamic_sampling)
        return cls(prompts_per_step=spec.training.prompts_per_step, total_steps=spec.training.steps,
                   max_staleness=a.max_staleness, every_steps=spec.weight_sync.every_steps,
                   max_resample_factor=a.max_resample_factor,
                   seed=spec.training.seed, overlong=a.overlong, max_tokens=spec.rollout.sampling.max_tokens,
                   timeout=float(spec.weight_sync.timeout_seconds) * 3, **kw)

    def published_before(self, step: int, published: int) -> int:
        """The version the rollouts will hold when the trainer takes `step` (pushes follow every
        everySteps-th step, never the last), given that `published` is pushed now."""
        last = min(step - 1, self.total_steps - 1)
        return max(published, last - last % self.every_steps)

    @property
    def queue_limit(self) -> int:
        """Environment groups held at most: a group submitted now can serve at most the steps until
        its version falls below the floor, (maxStaleness + 1) x everySteps of them."""
        return (self.max_staleness + 1) * self.every_steps * self.prompts_per_step

    def steps_ahead(self, taken: int, published: int) -> int:
        """How many of the next steps a group started now (at the `published` version) can still
        be trained on: 0 while the trainer trains at maxStaleness 0 (nothing runs ahead)."""
        step = taken
        while step < self.total_steps and self.published_before(step + 1, published) - self.max_staleness <= published:
            step += 1
        return step - taken


@dataclass
class StepGroups:
    """One step's groups (kept and dropped by dynamic sampling, in stream order) and what the
    pipeline did for them."""
    groups: list[Group]
    wait_seconds: float = 0.0  # the trainer's wait for them
    score_seconds: float = 0.0  # reward scoring of these groups (in the background)
    # of the time since the previous step, with nothing generating (None without a workflow of
    # its own: the trainer then only waits for environments, see wait_seconds)
    idle_fraction: Optional[float] = 0.0
    in_flight: int = 0  # groups generating or ready ahead, after this step took its own
    resampled: int = 0  # groups beyond promptsPerStep (dynamic-sampling refills)
    stale: int = 0  # groups dropped as too old since the previous step (generated again)
    sample_ids: list[int] = field(default_factory=list)  # dataset rows of the step's workflow groups
    from_environments: int = 0  # groups submitted by environments (grpojob.leader.trajectories)
    # per environment: groups, reward_mean, rewards (per submitted reward part), stale (dropped)
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
    environment_rewards: dict[str, tuple[float, float]] = field(default_factory=dict)  # part -> (mean, std)


def group_version(group: Group) -> int:
    return min(min(c.versions) if c.versions else c.policy_version for c in group.completions)


class SampleClient:
    """The generator as a workflow sees it for one sample: every call asks for at least the
    version floor and, when the workflow set no seed, gets one derived from the sample's."""

    def __init__(self, generator: Generator, floor, seed: int):
        self.generator, self.floor, self.seed, self.calls = generator, floor, seed, 0

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        if sampling.seed is None and sampling.temperature > 0:
            sampling = dataclasses.replace(sampling, seed=derive_seed(self.seed, self.calls))
        self.calls += 1
        return await self.generator.generate(prompt_ids, n, sampling, min_version=self.floor())


class WaitReport:
    """What a step waiting for its groups says: the log (at once when what it waits for changed,
    else every WAIT_LOG_SECONDS) and `on_wait` (the trainer's /status message; "" once the step
    has its groups). `health`: the generator's trouble in words (RolloutClient.health)."""

    def __init__(self, health: Optional[Callable[[], Optional[str]]], on_wait: Optional[Callable[[str], None]]):
        self.health, self.on_wait = health, on_wait
        self._said: Optional[tuple[str, float]] = None  # the last text reported, seconds into the wait

    def describe(self, waiting: str) -> str:
        trouble = self.health() if self.health is not None else None
        return waiting + (f"; {trouble}" if trouble else "")

    def waited(self, step: int, seconds: float, text: str) -> None:
        if self._said is not None and self._said[0] == text and seconds - self._said[1] < WAIT_LOG_SECONDS:
            return
        self._said = (text, seconds)
        log.warning("step %d has waited %.0f s for its groups: %s", step, seconds, text)
        if self.on_wait is not None:
            self.on_wait(f"step {step} waits for its groups: {text}")

    def done(self) -> None:
        if self._said is not None and self.on_wait is not None:
            self.on_wait("")
        self._said = None


class IdleClock:
    """The share of time with nothing generating, over the window since the last `fraction()`
    (a step's StepGroups.idle_fraction). Starts idle."""

    def __init__(self):
        now = time.monotonic()
        self._since: Optional[float] = now  # idle since (None: generating)
        self._idle, self._window = 0.0, now

    def busy(self) -> None:
        if self._since is not None:
            self._idle += time.monotonic() - self._since
            self._since = None

    def idle(self) -> None:
        self._since = time.monotonic()

    def fraction(self) -> float:
        """The idle share since the last call (0..1); the window restarts."""
        now = time.monotonic()
        if self._since is not None:
            self._idle += now - self._since
            self._since = now
        share = self._idle / max(now - self._window, 1e-9)
        self._idle, self._window = 0.0, now
        return min(1.0, share)
