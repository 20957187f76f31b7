"""GRPOJob status: what the operator writes and `kubectl get grpo` shows."""
from __future__ import annotations

from typing import Literal, Optional

from grpojob.api.base import Model, field

Phase = Literal["Pending", "Initializing", "Running", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]

CONDITION_TYPES = ("Created", "TrainerReady", "RolloutReady", "TrainerReachable", "WeightsInSync", "Running",
                   "Suspended", "Succeeded", "Failed", "InvalidSpec")

# What the trainer leader's /status reports (the contract between trainer and operator).
TRAINER_PHASES = ("starting", "running", "checkpointing", "completed", "failed", "suspended")


class Condition(Model):
    """A Kubernetes-style condition."""

    type: str = field(description="Condition type: " + ", ".join(CONDITION_TYPES) + ".")
    status: Literal["True", "False", "Unknown"] = field(description="True, False or Unknown.")
    reason: str = field("", description="CamelCase reason for the last transition.")
    message: str = field("", description="Human-readable detail.")
    last_transition_time: Optional[str] = field(None, description="RFC 3339 time of the last status change "
                                                "(the operator sets it on every condition).")
    observed_generation: Optional[int] = field(None, description="Spec generation this condition reflects.")


class RolloutLag(Model):
    """One rollout server as the trainer sees it."""
    replica: str = field(description="Rollout server (pod) name.")
    version: Optional[int] = field(None, description="Policy version it serves.")
    lag: Optional[int] = field(None, description="Policy versions it is behind the trainer.")


class EvaluationStatus(Model):
    """The last evaluation (spec.evaluation) of the policy."""
    step: int = field(description="Step whose policy was evaluated (0: the initial one).")
    policy_version: int = field(description="Policy version evaluated.")
    prompts: int = field(0, description="Held-out prompts evaluated.")
    samples_per_prompt: int = field(1, description="Completions per prompt (1: greedy).")
    reward_mean: Optional[float] = field(None, description="Mean reward (weighted sum of spec.rewards).")
    rewards: dict[str, float] = field(default_factory=dict, description="Mean of each reward function.")
    pass_at: dict[str, float] = field(default_factory=dict, description="pass@k by k: the chance that at least "
                                      "one of k completions reaches evaluation.passThreshold (unbiased estimator).")
    time: Optional[str] = field(None, description="RFC 3339 time the evaluation finished.")


class Progress(Model):
    step: int = field(0, description="Optimizer steps completed.")
    total_steps: int = field(0, description="Steps the job will run.")
    policy_version: int = field(0, description="Version of the newest policy weights.")
    reward_mean: Optional[float] = field(None, description="Mean reward of the last step.")
    kl: Optional[float] = field(None, description="KL to the reference policy at the last step.")
    tokens_per_second: Optional[float] = field(None, description="Training throughput at the last step.")
    last_checkpoint_step: Optional[int] = field(None, description="Step of the newest checkpoint.")
    weights_in_sync: Optional[bool] = field(None, description="All rollout servers serve the newest policy.")
    rollouts: list[RolloutLag] = field(default_factory=list, description="Policy lag of each rollout server.")
    weight_sync_backend: Optional[str] = field(None, description="Weight-sync path in use (nccl, cuda-ipc, "
                                               "gloo, checkpoint).")
    evaluation: Optional[EvaluationStatus] = field(None, description="The last evaluation (spec.evaluation).")
    placement: Optional[str] = field(None, description="separate, or colocated (turn-taking): generation and "
                                     "training alternate on the device (docs/colocated.md).")


class PipelineStatus(Model):
    """The last step's rollout signals (spec.rollout.autoscale's input)."""
    step: int = field(0, description="Step.")
    wait_seconds: float = field(0.0, description="Wait for groups.")
    step_seconds: float = field(0.0, description="Step time.")
    wait_fraction: Optional[float] = field(None, description="waitSeconds / stepSeconds.")
    rollout_idle_fraction: Optional[float] = field(None, description="Share of the step nothing generated.")
    groups_in_flight: int = field(0, description="Groups generated ahead.")
    policy_staleness: Optional[float] = field(None, description="Mean version lag of the samples.")


class AutoscaleStatus(Model):
    """spec.rollout.autoscale's last decision and signal."""
    replicas: int = field(description="Rollout servers wanted.")
    reason: str = field("", description="Why (docs/services.md).")
    message: str = field("", description="The decision in words.")
    last_scale_time: Optional[str] = field(None, description="Time of the last change.")
    last_step: int = field(-1, description="Last step counted.")
    direction: Literal["up", "down", "hold"] = field("hold", description="The streak's direction.")
    streak: int = field(0, description="Its steps.")
    proposal: int = field(0, description="Replicas it asks for.")
    wait_fraction: Optional[float] = field(None, description="The trainer's wait share.")
    idle_fraction: Optional[float] = field(None, description="The servers' idle share.")
    step_seconds: Optional[float] = field(None, description="Mean step s.")
    measured: Optional[int] = field(None, description="Its steps.")
    trial_from: Optional[int] = field(None, description="Replicas before.")
    before_seconds: Optional[float] = field(None, description="Step s before.")
    backoff_seconds: Optional[float] = field(None, description="Back-off s.")


class ReplicaStatus(Model):
    desired: int = field(0, description="Pods wanted.")
    ready: int = field(0, description="Pods ready.")


class GRPOJobStatus(Model):
    """Observed state of a GRPOJob, written by the operator."""

    phase: Phase = field("Pending", description="Pending, Initializing, Running, Suspended, Succeeded "
                         "or Failed.")
    message: str = field("", description="Why the job is in this phase.")
    conditions: list[Condition] = field(default_factory=list, description="Kubernetes-style conditions.")
    observed_generation: Optional[int] = field(None, description="Spec generation last reconciled.")
    start_time: Optional[str] = field(None, description="When the trainer first ran.")
    completion_time: Optional[str] = field(None, description="When the job succeeded or failed.")
    progress: Progress = field(default_factory=Progress, description="Training progress.")
    trainer: ReplicaStatus = field(default_factory=ReplicaStatus, description="Trainer pods.")
    rollout: ReplicaStatus = field(default_factory=ReplicaStatus, description="Rollout pods.")
    restarts: int = field(0, description="Trainer restarts counted against runPolicy.backoffLimit.")
    autoscale: Optional[AutoscaleStatus] = field(None, description="rollout.autoscale's last decision.")


class StageMemory(Model):
    """Peak memory of the trainer leader's process during one step stage."""
    host_peak_bytes: Optional[int] = field(None, description="Peak resident host memory (bytes).")
    device_peak_bytes: Optional[int] = field(None, description="Peak allocated GPU memory (bytes); CUDA only.")


class ServiceCalls(Model):
    """One training-service operation's calls so far."""
    calls: int = field(0, description="Calls answered.")
    refused: int = field(0, description="Calls refused as the caller's fault (HTTP 4xx).")
    failed: int = field(0, description="Calls that failed in the trainer (HTTP 5xx).")
    seconds: float = field(0.0, description="Time spent answering them, queue wait included.")
    tokens: int = field(0, description="Tokens of the calls that succeeded.")


class ServiceStatus(Model):
    """spec.mode service: the training API's calls."""
    queued: int = field(0, description="Calls waiting for the trainer.")
    ops: dict[str, ServiceCalls] = field(default_factory=dict, description="Calls per operation.")


class TrainerStatus(Model):
    """JSON served at the trainer leader's /status."""
    phase: Literal["starting", "running", "checkpointing", "completed", "failed", "suspended"] = field(
        "starting", description="Trainer phase.")
    step: int = field(0, description="Steps completed.")
    total_steps: int = field(0, description="Steps to run.")
    policy_version: int = field(0, description="Newest policy version.")
    reward_mean: Optional[float] = field(None, description="Mean reward of the last step.")
    kl: Optional[float] = field(None, description="KL at the last step.")
    tokens_per_second: Optional[float] = field(None, description="Training tokens/s at the last step.")
    last_checkpoint_step: Optional[int] = field(None, description="Newest checkpoint step.")
    weights_in_sync: Optional[bool] = field(None, description="Every rollout serves policyVersion.")
    rollouts: list[RolloutLag] = field(default_factory=list, description="Policy lag of each rollout server.")
    weight_sync_backend: Optional[str] = field(None, description="Weight-sync path in use.")
    placement: Optional[str] = field(None, description="separate, or colocated (turn-taking): the engine "
                                     "sleeps while the trainer trains, nothing overlaps on the device.")
    stage_memory: dict[str, StageMemory] = field(
        default_factory=dict, description="Peak memory per stage of the last step (generate, train, sync, "
        "checkpoint), rank 0's process.")
    service: Optional[ServiceStatus] = field(None, description="mode service: the training API's calls.")
    evaluation: Optional[EvaluationStatus] = field(None, description="The last evaluation (spec.evaluation).")
    pipeline: Optional[PipelineStatus] = field(None, description="The last step's rollout signals.")
    message: str = field("", description="Detail (the error on failure).")
