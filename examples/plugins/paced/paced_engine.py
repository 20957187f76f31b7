"""PacedEngine: the hf engine with the throughput of a busy accelerator, to rehearse
spec.rollout.autoscale on a laptop (examples/plugins/paced/autoscale-paced.yaml).

On a machine with a few CPU cores, more hf servers only share the same cores: generation does not
get faster with more of them, so an autoscaler has nothing to gain. A rollout server on its own
GPU does scale: its throughput is its own. This engine acts that out without burning CPU: each
request holds the server for `n x secondsPerCompletion` seconds (one request at a time, as a
saturated engine's throughput is fixed, so requests queue and N servers take 1/N of the time),
then the hf engine generates it as usual (its tokens, log-probs and policy versions are real).

    rollout:
      backend: paced_engine.py:PacedEngine      # with code.localPath: examples/plugins/paced
      engineArgs:
        pace:                                   # by the policy version the server holds
          - {fromVersion: 0, secondsPerCompletion: 0.02}    # slow: long completions
          - {fromVersion: 12, secondsPerCompletion: 0.001}  # fast from policy version 12 on

A schedule by policy version makes generation slow, then fast, within one run, the same way on
every server (a server that joins later holds the current version), as a job's completions grow
or shrink while it learns. The pace is read when a request takes the server.
"""
from __future__ import annotations

import asyncio

from grpojob.plugins import Completion, HFEngine, SamplingParams


def schedule(engine_args: dict) -> list[tuple[int, float]]:
    """engineArgs.pace as (fromVersion, secondsPerCompletion), sorted; ValueError naming the field."""
    pace = engine_args.get("pace", [{"fromVersion": 0, "secondsPerCompletion": 0.01}])
    if not isinstance(pace, list) or not pace:
        raise ValueError("spec.rollout.engineArgs.pace: a list of {fromVersion, secondsPerCompletion} is expected")
    out = []
    for i, p in enumerate(pace):
        try:
            v, s = int(p.get("fromVersion", 0)), float(p["secondsPerCompletion"])
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ValueError(f"spec.rollout.engineArgs.pace[{i}]: {{fromVersion: int, secondsPerCompletion: "
                             f"number}} is expected, not {p!r}") from None
        if v < 0 or s < 0:
            raise ValueError(f"spec.rollout.engineArgs.pace[{i}]: fromVersion and secondsPerCompletion must be >= 0")
        out.append((v, s))
    return sorted(out)


class PacedEngine(HFEngine):
    backend = "paced-hf"
    weight_sync = ("auto", "cuda-ipc", "shm", "gloo", "checkpoint")  # the hf engine's

    def __init__(self, spec):
        super().__init__(spec)
        self.pace = schedule(dict(spec.rollout.engine_args or {}))
        self._busy = asyncio.Lock()  # the modelled accelerator: one request at a time

    def seconds_per_completion(self) -> float:
        """The pace at the policy version held now."""
        now = 0.0
        for version, seconds in self.pace:
            if self.version >= version:
                now = seconds
        return now

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams) -> list[Completion]:
        async with self._busy:
            await asyncio.sleep(n * self.seconds_per_completion())
        return await super().generate(prompt_ids, n, sampling)
