"""The evaluation's two halves: the `Evaluator` generates and scores the held-out prompts on the
rollout manager's event loop (the same generator, workflow kind and reward scorer as training, a
prompt list of its own), and `Evaluation` is rank 0's handle the training loop starts and finishes.

    evaluation = Evaluation.build(spec, tokenizer, manager)   # rank 0, with the RolloutManager
    evaluation.start(step, version)    # right after `version` was pushed: runs while training goes on
    record = evaluation.finish()       # before the next push (blocks only while it still generates)
    evaluation.close()

Every generate call asks for exactly the pushed version (the version floor of its requests) and the
next push waits for the evaluation, so an evaluation measures one policy and stalls training by at
most its own generation time.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, Optional

from grpojob.api.spec import GRPOJobSpec
from grpojob.data import PromptSettings, load_samples
from grpojob.leader import workflows
from grpojob.rewards import RewardScorer, ScoringSettings
from grpojob.leader.pipeline import SampleClient
from grpojob.contracts.rollout import Generator, Group, GroupRejected, Sample, derive_seed
from grpojob.leader.evaluation.scores import EvalRecord, summarise

log = logging.getLogger("grpojob.leader.evaluation")

WHERE = "spec.evaluation.dataset"  # the field dataset errors name
SEED_SALT = 0x6576616C  # "eval": evaluation seeds differ from the training stream's
# Workflows that make something besides one group per prompt evaluate as single-turn.
SINGLE_TURN_FOR = ("none", "greedy-baseline")


class EvaluationError(RuntimeError):
    """An evaluation could not be done; the message says which step and why."""


def evaluation_spec(spec: GRPOJobSpec) -> GRPOJobSpec:
    """The job as the evaluation's prompts and workflow see it: the held-out dataset, samplesPerPrompt
    completions per prompt (the workflow's groupSize) with the evaluation's sampling (greedy for one).
    A workflow plug-in is constructed as Class(spec, tokenizer), so it gets this view. Not validated
    (a groupSize of 1 is the evaluation's, never the trainer's)."""
    ev = spec.evaluation
    assert ev is not None
    workflow = "single-turn" if spec.rollout.workflow in SINGLE_TURN_FOR else spec.rollout.workflow
    return spec.model_copy(update={
        "dataset": ev.dataset,
        "algorithm": spec.algorithm.model_copy(update={"group_size": ev.samples_per_prompt}),
        "rollout": spec.rollout.model_copy(update={"sampling": spec.evaluation_sampling, "workflow": workflow})})


class Evaluator:
    """Runs on the manager's event loop: every held-out prompt's group generated (at most
    `concurrency` at a time) and scored."""

    def __init__(self, spec: GRPOJobSpec, tokenizer: Any, generator: Generator, *, concurrency: int = 256):
        ev = spec.evaluation
        assert ev is not None, "spec.evaluation is not set"
        view = evaluation_spec(spec)
        self.settings, self.seed, self.generator = ev, spec.training.seed, generator
        # a streamed set: only the rows maxPrompts asks for are read (docs/data.md)
        limit = ev.max_prompts if view.dataset.streaming else None
        self.samples: list[Sample] = load_samples(PromptSettings.of(view), tokenizer, WHERE, limit)[:ev.max_prompts]
        self.workflow = workflows.build(view, tokenizer)
        # the job's rewards and judges over the held-out rows (their fields: ev.dataset's)
        self.scorer = RewardScorer(ScoringSettings(spec.rewards, spec.judges, ev.dataset), tokenizer)
        self.concurrency = concurrency

    async def run(self, step: int, version: int) -> EvalRecord:
        t0 = time.perf_counter()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(sample: Sample) -> Group:
            async with gate:
                # The same seed at every evaluation: the curve compares policies, not sampling noise.
                client = SampleClient(self.generator, lambda: version, derive_seed(self.seed, SEED_SALT, sample.index))
                try:
                    group = await self.workflow.run(client, sample)
                except GroupRejected as e:  # a training filter's: an evaluation scores every prompt
                    if e.group is None:
                        raise
                    group = e.group
                await self.scorer.score_group(group)
                return group

        groups = await asyncio.gather(*(one(s) for s in self.samples))
        ev = self.settings
        return summarise(list(groups), step=step, version=version, threshold=ev.pass_threshold, ks=ev.ks,
                         samples_per_prompt=ev.samples_per_prompt, seconds=time.perf_counter() - t0)


class Evaluation:
    """Rank 0's handle: at most one evaluation in flight, on the manager's event loop."""

    def __init__(self, evaluator: Evaluator, spawn):
        self.evaluator, self._spawn = evaluator, spawn  # spawn(coroutine) -> concurrent.futures.Future
        self._running: Optional[tuple[int, concurrent.futures.Future]] = None

    @classmethod
    def build(cls, spec: GRPOJobSpec, tokenizer: Any, manager) -> "Evaluation":
        """Over a RolloutManager: its generator, and its event loop to run on."""
        evaluator = Evaluator(spec, tokenizer, manager.generator, concurrency=manager.pipeline.max_concurrency)
        log.info("evaluation: %d held-out prompts x %d completion(s)", len(evaluator.samples),
                 spec.evaluation.samples_per_prompt)
        return cls(evaluator, manager.spawn)

    def start(self, step: int, version: int) -> None:
        """Evaluate the policy `version` (the one of `step`), which the rollouts hold now."""
        assert self._running is None, "finish() the previous evaluation first"
        self._running = (step, self._spawn(self.evaluator.run(step, version)))

    def finish(self) -> Optional[EvalRecord]:
        """The evaluation started last, waited for (None when none runs)."""
        if self._running is None:
            return None
        (step, fut), self._running = self._running, None
        try:
            return fut.result()
        except Exception as e:
            raise EvaluationError(f"evaluation of step {step} failed: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        """Drop an evaluation still running (a suspended or failed run)."""
        if self._running is not None:
            self._running[1].cancel()
            self._running = None
