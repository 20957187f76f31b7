"""What the live scene (tests/monitoring/scene.py) must show: every metric and every dashboard panel,
each either measured (with the values it may take) or named here as not measured, and why.

A metric that nothing sets has no sample, so its panel has no data: unless it is listed below, the
tests fail on it. An entry below that starts getting samples fails too, so the lists stay true.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Not measured in the scene's job (examples/tiny-local.yaml), by design: no sample, no data.
_TRAIN_MODE = "the scene's job runs spec.mode train: nothing calls the training service (tests/service covers it)"
NOT_MEASURED = {
    "grpojob_kl": "algorithm.klBeta is 0: no reference model is loaded and KL is not computed",
    "grpojob_stage_device_memory_peak_bytes": "the scene's trainer runs on the CPU: no device memory",
    "grpojob_service_requests_total": _TRAIN_MODE,
    "grpojob_service_request_seconds": _TRAIN_MODE,
    "grpojob_service_tokens_total": _TRAIN_MODE,
    "grpojob_service_queued_requests": _TRAIN_MODE,
    "grpojob_job_autoscale_wait_fraction": "the scene's job has no spec.rollout.autoscale (tests/operator_k8s/"
                                           "test_autoscale.py measures it)",
    "grpojob_job_autoscale_idle_fraction": "the scene's job has no spec.rollout.autoscale (tests/operator_k8s/"
                                           "test_autoscale.py measures it)",
    **{name: "the scene's job has no spec.judges (tests/judge/test_server.py measures them)" for name in (
        "grpojob_judge_queue_depth", "grpojob_judge_requests_total", "grpojob_judge_request_seconds",
        "grpojob_judge_batch_size", "grpojob_judge_scored_total", "grpojob_judge_unparsed_total")},
    **{name: "the scene's job has no spec.judges (tests/judge/test_watch.py measures them)" for name in (
        "grpojob_trainer_judge_request_seconds", "grpojob_trainer_judge_requests_in_flight",
        "grpojob_trainer_judge_failures_total", "grpojob_trainer_judge_unscored_groups_total")},
}

# Named in metrics_names but not set on this path yet. When the trainer starts setting one, the
# tests fail until it leaves this list.
PENDING: dict[str, str] = {}

ABSENT = {**NOT_MEASURED, **PENDING}


@dataclass(frozen=True)
class Range:
    """Every value of the panel lies in [lo, hi]; `positive` also needs the largest one > lo."""
    lo: float = -math.inf
    hi: float = math.inf
    positive: bool = False

    def problems(self, values: list[float]) -> list[str]:
        out = [f"{v} outside [{self.lo}, {self.hi}]" for v in values if not self.lo <= v <= self.hi]
        if self.positive and values and max(values) <= self.lo:
            out.append(f"no value above {self.lo}: {values}")
        return out


ANY = Range()
FRACTION = Range(0, 1)
COUNT = Range(0)
POSITIVE = Range(0, positive=True)

# Every panel of the dashboard, by title: the values its measured queries may return in the scene
# (one trainer leader, one rollout server, the operator, a job with a toy reward in [0, 1]).
PANELS = {
    "Jobs by phase": COUNT,
    "Progress": Range(0, 1, positive=True),
    "Trainer pods ready": Range(1, 1),
    "Rollout pods ready": Range(1, 1),
    "Trainer restarts": Range(0, 0),
    "Reward mean by reward function": FRACTION,  # the toy reward is a share of words
    "Reward std by reward function": FRACTION,
    "Advantages": ANY,
    "Wasted samples": FRACTION,
    "KL to reference": COUNT,
    "Entropy": POSITIVE,
    "Loss": ANY,
    "Clip fraction": FRACTION,
    "Gradient norm and learning rate": POSITIVE,
    "Completion length": Range(0, 4, positive=True),  # rollout.sampling.maxTokens is 4
    "Evaluation reward by reward function": FRACTION,
    "Evaluation pass@k": FRACTION,
    "Evaluated step": COUNT,
    "Evaluation time": POSITIVE,
    "Tokens per second": COUNT,
    "Step time by stage": COUNT,
    "Step time": POSITIVE,
    "Peak memory by stage": POSITIVE,  # host bytes (no GPU in the scene)
    "Sample staleness": COUNT,
    "Trainer wait and generation pauses": COUNT,
    "Rollout idle and trainer wait shares": FRACTION,
    "Groups in flight": COUNT,
    "Resampled and stale groups": COUNT,
    "Rollout server lag": COUNT,
    "Weight sync duration": POSITIVE,
    "Bytes per weight push": POSITIVE,  # the scene's job pushes its full weights every step
    "Policy version": Range(1, positive=True),
    "Rollout servers in the sync group": Range(1, 1),  # the issue: at least one server, here exactly one
    "Importance weights": POSITIVE,
    "Queue depth": COUNT,
    "Generation throughput per server": COUNT,
    "Requests by result": COUNT,
    "Service calls": COUNT,
    "Service call time": COUNT,
    "Service tokens": COUNT,
    "Judge queue and batches": COUNT,
    "Judge latency": COUNT,
    "Judge requests": COUNT,
    "Judge latency at the trainer": COUNT,
    "Judge requests at the trainer": COUNT,
    "Reconciles by result": COUNT,
    "Reconcile duration": POSITIVE,
    "Child-object errors": Range(0, 0),
}
