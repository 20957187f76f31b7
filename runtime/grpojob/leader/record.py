"""The typed record of one training step: the single source of metrics.jsonl, the leader's /status
and its Prometheus gauges (numbers identical on every rank)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from grpojob.api.status import PipelineStatus, StageMemory


@dataclass
class StepRecord:
    step: int
    policy_version: int
    learning_rate: float
    # rewards and advantages (global over ranks; every group the step considered)
    reward_mean: Optional[float] = None
    reward_std: Optional[float] = None
    rewards: dict[str, float] = field(default_factory=dict)  # per reward function
    rewards_std: dict[str, float] = field(default_factory=dict)
    advantage_mean: Optional[float] = None
    advantage_std: Optional[float] = None
    completion_length_mean: Optional[float] = None
    truncated_fraction: Optional[float] = None
    zero_std_group_fraction: Optional[float] = None
    groups: int = 0
    groups_kept: int = 0
    completions: int = 0
    # off-policy: versions behind the trainer of the tokens trained on, and the correction
    policy_staleness: Optional[float] = None
    policy_staleness_max: Optional[float] = None
    importance_weight_mean: Optional[float] = None
    importance_weight_max: Optional[float] = None
    # optimisation
    skipped: bool = False
    micro_batches: int = 0
    loss: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: Optional[float] = None
    entropy: Optional[float] = None
    kl: Optional[float] = None  # None when no KL is computed (klBeta 0)
    tokens: int = 0  # prompt + completion tokens of every sampled completion
    trained_tokens: int = 0
    tokens_per_second: Optional[float] = None
    train_tokens_per_second: Optional[float] = None
    # the train stage's model FLOPs per second (grpojob.learner.flops: trained tokens, forward and
    # backward) and their share of the GPU's dense bf16 peak (None on a CPU or an unknown GPU)
    train_flops_per_second: Optional[float] = None
    mfu: Optional[float] = None
    # the pipeline
    wait_seconds: float = 0.0  # the trainer waiting for groups (= stage "generate")
    wait_fraction: Optional[float] = None  # wait_seconds / step_seconds (set from them when left out)
    rollout_idle_fraction: Optional[float] = None
    groups_in_flight: int = 0
    groups_resampled: int = 0
    groups_stale: int = 0
    sync_seconds: float = 0.0
    generation_paused_seconds: Optional[float] = None
    sync_bytes: Optional[int] = None  # tensor bytes of this step's push (LoRA: the adapter's); None: no push
    sync_tensors: Optional[int] = None  # tensors in it
    weight_sync_backend: Optional[str] = None
    rollouts: list[dict[str, Any]] = field(default_factory=list)  # replica, version, lag
    published: bool = False
    sample_ids: list[int] = field(default_factory=list)  # dataset rows this step considered
    # environments (grpojob.leader.trajectories): groups they submitted that this step trained on, and per
    # environment: groups, reward_mean, rewards (their own parts), stale (dropped below the floor)
    groups_from_environments: int = 0
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # peak memory of trainer rank 0's process per stage the loop runs (generate: its wait for
    # groups, train, sync, checkpoint: the part it waits for): host RSS, and device on CUDA
    stage_host_peak_bytes: dict[str, int] = field(default_factory=dict)
    stage_device_peak_bytes: dict[str, int] = field(default_factory=dict)
    step_seconds: float = 0.0
    # spec.placement: "separate", or "colocated (turn-taking)": the engine slept while the step
    # trained. turns: {sleep|wake|sync: the engine's numbers} (seconds, decode_steps, freed_bytes,
    # device_used_bytes on CUDA); engine_host_peak_bytes: the engine process's peak resident memory
    # per phase (generate: until it slept, train: while asleep, sync: from wake through the push)
    placement: str = "separate"
    turns: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine_host_peak_bytes: dict[str, int] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    extra: dict[str, float] = field(default_factory=dict)  # plug-ins' own numbers

    def __post_init__(self) -> None:
        if self.wait_fraction is None and self.step_seconds > 0:
            self.wait_fraction = round(min(1.0, self.wait_seconds / self.step_seconds), 6)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scalars(self) -> dict[str, float]:
        """Every number of the record under a flat name (`rewards/toy`, `stage_seconds/train`,
        `extra/aux_loss`): what the experiment trackers log at `step`. Unknown values are left out."""
        out: dict[str, float] = {}
        for key, value in self.to_json().items():
            if key in ("step", "time"):
                continue
            if isinstance(value, dict):
                out.update({f"{key}/{k}": float(v) for k, v in value.items() if _number(v)})
            elif _number(value):
                out[key] = float(value)
        return out

    def status_fields(self) -> dict[str, Any]:
        """What the leader's /status shows of this step (grpojob.api.TrainerStatus fields)."""
        stages = {s: StageMemory(host_peak_bytes=self.stage_host_peak_bytes.get(s),
                                 device_peak_bytes=self.stage_device_peak_bytes.get(s))
                  for s in {**self.stage_host_peak_bytes, **self.stage_device_peak_bytes}}
        return {"step": self.step, "policy_version": self.policy_version, "reward_mean": self.reward_mean,
                "kl": self.kl, "tokens_per_second": self.tokens_per_second, "rollouts": self.rollouts,
                "weight_sync_backend": self.weight_sync_backend, "stage_memory": stages,
                "placement": self.placement,
                "pipeline": PipelineStatus(step=self.step, wait_seconds=self.wait_seconds,
                                           step_seconds=self.step_seconds, wait_fraction=self.wait_fraction,
                                           rollout_idle_fraction=self.rollout_idle_fraction,
                                           groups_in_flight=self.groups_in_flight,
                                           policy_staleness=self.policy_staleness)}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
