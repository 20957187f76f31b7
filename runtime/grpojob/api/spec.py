"""The GRPOJob spec (v1alpha1): the one source of truth for the CRD, the operator and the runtime."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import field_validator, model_validator

from . import plugins
from .base import FreeForm, Model, Quantity, field
from .status import GRPOJobStatus

GROUP = "grpojob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ["grpo"]

# Ports every process of a job agrees on (cluster defaults; `grpojob run` remaps them locally).
RENDEZVOUS_PORT = 29500  # torchrun master port on trainer pod 0
SYNC_STORE_PORT = 29600  # weight-sync TCPStore hosted by trainer rank 0


def _plugin(kind: str, value: str) -> str:
    err = plugins.check_name(kind, value)
    if err:
        raise ValueError(err)
    return value


class ModelSpec(Model):
    path: str = field(description="Directory of a Hugging Face model (config, safetensors, tokenizer). "
                      "On a cluster: a path inside the image or on `volumeClaim`, mounted at /models.",
                      min_length=1)
    volume_claim: Optional[str] = field(None, description="PersistentVolumeClaim holding the model, "
                                        "mounted read-only at /models in trainer and rollout pods.")
    tokenizer: Optional[str] = field(None, description="Tokenizer directory, when not the model's own.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        "auto", description="Parameter dtype. auto: rollout engines serve bfloat16 on GPU and float32 "
        "on CPU; the trainer keeps float32 weights and computes in bfloat16 autocast on GPU.")
    use_chat_template: bool = field(False, description="Render prompts with the tokenizer's chat template.")
    trust_remote_code: bool = field(False, description="Allow custom modelling code shipped with the model.")


class DatasetSpec(Model):
    path: Optional[str] = field(None, description="A .jsonl or .parquet file, or a `datasets` directory "
                                "saved with save_to_disk. Exactly one of path and factory.")
    factory: Optional[str] = field(None, description="A built-in dataset (toy, countdown) or "
                                   "'module:function' returning an iterable of dict rows.")
    args: FreeForm = field(default_factory=dict, description="Keyword arguments for the factory.")
    format: Literal["auto", "jsonl", "parquet", "disk"] = field(
        "auto", description="File format of path; auto picks by extension (a directory means disk).")
    prompt_field: str = field("prompt", description="Row field holding the prompt text.")
    messages_field: Optional[str] = field(None, description="Row field holding chat messages "
                                          "(list of {role, content}); used instead of promptField.")
    answer_field: str = field("answer", description="Row field holding the reference answer given to rewards.")
    max_prompt_length: int = field(512, ge=1, description="Prompts longer than this many tokens are dropped.")
    shuffle: bool = field(True, description="Shuffle rows each epoch (seeded by training.seed).")

    @field_validator("factory")
    @classmethod
    def _factory(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _plugin("dataset", v)

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetSpec":
        if (self.path is None) == (self.factory is None):
            raise ValueError("set exactly one of path and factory")
        return self


class RewardSpec(Model):
    """One reward function and its weight."""

    name: str = field(description="A built-in reward (math_exact, format, countdown, exact_match, toy) or "
                      "'module:function' with signature (prompt, completion, **row) -> float, sync or async.")
    weight: float = field(1.0, description="Weight of this reward in the summed reward.")
    args: FreeForm = field(default_factory=dict, description="Keyword arguments bound to the reward function.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _plugin("reward", v)


class OverlongSpec(Model):
    mode: Literal["none", "filter", "penalty"] = field(
        "none", description="Truncated completions: keep (none), drop from the loss (filter), "
                            "or shape the reward near the limit (penalty, DAPO soft overlong punishment).")
    buffer_tokens: int = field(0, ge=0, description="Penalty ramps over this many tokens before maxTokens.")
    penalty: float = field(1.0, ge=0, description="Largest penalty subtracted at the limit.")


class AlgorithmSpec(Model):
    name: str = field("grpo", description="grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, or 'module:Class'.")
    group_size: int = field(8, ge=2, description="Completions sampled per prompt (the GRPO group).")
    loss_aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = field(
        "token-mean", description="How per-token losses become one number, over the global batch.")
    clip_eps_low: float = field(0.2, ge=0, le=1, description="Lower PPO clip: ratio >= 1 - clipEpsLow.")
    clip_eps_high: float = field(0.2, ge=0, le=10, description="Upper PPO clip: ratio <= 1 + clipEpsHigh "
                                 "(DAPO clip-higher uses a larger value than clipEpsLow).")
    kl_beta: float = field(0.0, ge=0, description="Weight of the KL penalty to the frozen reference model; "
                           "0 loads no reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", description="KL estimator (Schulman's k1/k2/k3).")
    advantage_normalization: Literal["group", "batch", "none"] = field(
        "group", description="Divide advantages by the reward std of the group, of the batch, or not at all.")
    max_staleness: int = field(0, ge=0, description="How many policy versions generation may run ahead "
                               "of training; 0 is strictly on-policy.")
    importance_cap: float = field(2.0, ge=1, description="Cap of the truncated importance weight "
                                  "pi_old/pi_rollout that corrects stale rollout samples.")
    dynamic_sampling: bool = field(False, description="Drop groups whose rewards are all equal (DAPO) and "
                                   "replace them with newly sampled groups, up to maxResampleFactor.")
    max_resample_factor: float = field(3.0, ge=1, le=100, description="Dynamic sampling: at most this many "
                                       "times promptsPerStep groups are generated for one step; a step "
                                       "that still has too few trains on what it has.")
    partial_rollouts: bool = field(False, description="When a weight push lands mid-generation, abort the "
                                   "in-flight requests and resume them on the new weights (tokens keep the "
                                   "version that produced them); false lets them finish on the old weights.")
    epochs: int = field(1, ge=1, description="Optimisation passes over each step's samples.")
    overlong: OverlongSpec = field(default_factory=OverlongSpec, description="Handling of truncated completions.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _plugin("algorithm", v)


class TrainingSpec(Model):
    steps: int = field(100, ge=1, description="Optimizer steps to run.")
    prompts_per_step: int = field(8, ge=1, description="Prompts per step (global, across all trainer ranks).")
    micro_batch_tokens: int = field(4096, ge=16, description="Token budget of one packed micro-batch per rank.")
    learning_rate: float = field(1e-6, gt=0, le=1, description="Peak learning rate (AdamW).")
    lr_schedule: Literal["constant", "linear", "cosine"] = field("constant", description="Decay after warmup.")
    warmup_steps: int = field(0, ge=0, description="Linear warmup steps.")
    weight_decay: float = field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = field(1.0, ge=0, description="Max global gradient norm; 0 disables clipping.")
    seed: int = field(0, ge=0, description="Seed for data order, sampling and initialisation.")
    strategy: Literal["auto", "fsdp", "ddp"] = field("auto", description="Data parallelism: auto is FSDP2 "
                                                   "on GPU and DDP on CPU.")
    gradient_checkpointing: bool = field(False, description="Recompute activations to save memory.")


class EnvVar(Model):
    """An environment variable of the pods."""

    name: str = field(description="Environment variable name.", min_length=1)
    value: Optional[str] = field(None, description="Literal value.")
    value_from: Optional[FreeForm] = field(None, description="A Kubernetes EnvVarSource (secretKeyRef...).")


class ResourceSpec(Model):
    requests: dict[str, Quantity] = field(default_factory=dict, description="Kubernetes resource requests.")
    limits: dict[str, Quantity] = field(default_factory=dict, description="Kubernetes resource limits "
                                        "(e.g. nvidia.com/gpu: 8).")


class WorkloadSpec(Model):
    image: Optional[str] = field(None, description="Container image; defaults to the operator's runtime image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = field(
        "IfNotPresent", description="Kubernetes image pull policy.")
    resources: ResourceSpec = field(default_factory=ResourceSpec, description="Per-pod resources.")
    env: list[EnvVar] = field(default_factory=list, description="Extra environment variables.")
    node_selector: dict[str, str] = field(default_factory=dict, description="Kubernetes node selector.")
    tolerations: list[FreeForm] = field(default_factory=list, description="Kubernetes tolerations.")
    affinity: Optional[FreeForm] = field(None, description="Kubernetes affinity.")
    priority_class_name: Optional[str] = field(None, description="Kubernetes priority class.")
    service_account_name: Optional[str] = field(None, description="Service account of the pods.")
    labels: dict[str, str] = field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = field(default_factory=dict, description="Extra pod annotations.")


class TrainerSpec(WorkloadSpec):
    replicas: int = field(1, ge=1, description="Trainer pods (nodes); torchrun --nnodes.")
    processes_per_replica: int = field(1, ge=1, description="Ranks per pod; torchrun --nproc-per-node "
                                       "(usually the GPUs per node).")
    port: int = field(9400, ge=1024, le=65535, description="HTTP port of the trainer leader: "
                      "/healthz, /status, /metrics.")


class SamplingSpec(Model):
    temperature: float = field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = field(-1, ge=-1, description="Top-k sampling; -1 disables.")
    max_tokens: int = field(256, ge=1, description="Maximum completion length in tokens.")


class RolloutSpec(WorkloadSpec):
    replicas: int = field(1, ge=1, description="Rollout server pods.")
    backend: Literal["vllm", "hf"] = field("vllm", description="Generation engine: vllm, or hf "
                                           "(transformers, for CPU and small runs).")
    tensor_parallel_size: int = field(1, ge=1, description="vLLM tensor parallelism per rollout pod.")
    gpu_memory_utilization: float = field(0.9, gt=0, le=1, description="vLLM GPU memory fraction.")
    max_model_len: Optional[int] = field(None, ge=16, description="vLLM context length; default: "
                                         "maxPromptLength + maxTokens.")
    enforce_eager: bool = field(False, description="Disable CUDA graphs in vLLM.")
    sampling: SamplingSpec = field(default_factory=SamplingSpec, description="Sampling parameters.")
    workflow: str = field("single-turn", description="Rollout workflow: single-turn, greedy-baseline, or "
                          "'module:Class' with an async run(client, sample).")
    port: int = field(8000, ge=1024, le=65535, description="HTTP port of each rollout server.")

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        return _plugin("workflow", v)


class WeightSyncSpec(Model):
    backend: Literal["auto", "nccl", "gloo", "checkpoint"] = field(
        "auto", description="auto: NCCL on GPU, gloo on CPU; checkpoint: rollouts reload the newest "
                            "checkpoint from a shared volume.")
    bucket_size_mb: int = field(256, ge=1, description="Flat broadcast bucket size in MiB.")
    every_steps: int = field(1, ge=1, description="Push weights every N optimizer steps.")
    timeout_seconds: int = field(600, ge=1, description="Timeout of every weight-sync collective.")


class CheckpointSpec(Model):
    volume_claim: Optional[str] = field(None, description="PersistentVolumeClaim for checkpoints, mounted at "
                                        "path in trainer pods (and rollout pods with backend checkpoint).")
    path: str = field("/checkpoints", description="Checkpoint directory (locally: relative to the run dir).")
    every_steps: int = field(50, ge=1, description="Save every N steps (and always at the end).")
    keep_last: int = field(3, ge=1, description="Keep the newest K checkpoints.")
    resume: bool = field(True, description="Resume from the newest checkpoint when one exists.")


class RunPolicy(Model):
    suspend: bool = field(False, description="Checkpoint, then scale trainer and rollouts to zero; "
                          "false resumes from the checkpoint.")
    backoff_limit: int = field(3, ge=0, description="Trainer restarts tolerated before the job fails.")
    active_deadline_seconds: Optional[int] = field(None, ge=1, description="Fail the job after this long.")
    ttl_seconds_after_finished: Optional[int] = field(None, ge=0, description="Delete the job this long "
                                                       "after it finished.")
    clean_pod_policy: Literal["None", "Running", "All"] = field(
        "All", description="On completion: delete no pods, the ones still running, or all.")


class SchedulingSpec(Model):
    gang: Literal["none", "kueue", "volcano"] = field("none", description="Gang scheduling of trainer and "
                                                      "rollout pods together: Kueue pod group or Volcano PodGroup.")
    queue_name: Optional[str] = field(None, description="Kueue LocalQueue or Volcano queue.")
    scheduler_name: Optional[str] = field(None, description="Pod scheduler (volcano sets it by default).")


class MonitoringSpec(Model):
    pod_monitor: bool = field(False, description="Create a Prometheus Operator PodMonitor for the job's pods.")
    log_format: Literal["json", "text"] = field("json", description="Structured log format of the processes.")


class GRPOJobSpec(Model):
    """Desired state of a GRPOJob: the policy, its data and rewards, and how to train and serve it."""

    model: ModelSpec = field(description="The policy model.")
    dataset: DatasetSpec = field(description="Prompts (and reference answers).")
    rewards: list[RewardSpec] = field(description="Reward functions, summed with their weights.", min_length=1)
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec, description="GRPO-family algorithm.")
    training: TrainingSpec = field(default_factory=TrainingSpec, description="Optimisation settings.")
    trainer: TrainerSpec = field(default_factory=TrainerSpec, description="Trainer pods (torchrun).")
    rollout: RolloutSpec = field(default_factory=RolloutSpec, description="Rollout servers.")
    weight_sync: WeightSyncSpec = field(default_factory=WeightSyncSpec, description="Trainer to rollout "
                                        "weight transfer.")
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec, description="Checkpoints and resume.")
    run_policy: RunPolicy = field(default_factory=RunPolicy, description="Lifecycle: suspend, failures, cleanup.")
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec, description="Gang scheduling hints.")
    monitoring: MonitoringSpec = field(default_factory=MonitoringSpec, description="Metrics and logs.")

    @model_validator(mode="after")
    def _consistent(self) -> "GRPOJobSpec":
        t = self.training
        longest = self.dataset.max_prompt_length + self.rollout.sampling.max_tokens
        if t.micro_batch_tokens < longest:
            raise ValueError(
                f"training.microBatchTokens ({t.micro_batch_tokens}) must hold one whole sequence: "
                f"dataset.maxPromptLength + rollout.sampling.maxTokens = {longest}")
        ranks = self.trainer.replicas * self.trainer.processes_per_replica
        if t.prompts_per_step % ranks:
            raise ValueError(f"training.promptsPerStep ({t.prompts_per_step}) must be a multiple of the "
                             f"trainer ranks (replicas x processesPerReplica = {ranks})")
        if self.weight_sync.backend == "nccl" and self.rollout.backend == "hf":
            raise ValueError("weightSync.backend nccl needs rollout.backend vllm on GPUs; use auto or gloo")
        return self


class ObjectMeta(Model):
    """The parts of Kubernetes metadata the runtime reads (the API server keeps the rest)."""
    model_config = Model.model_config | {"extra": "allow"}
    # Children are named <name>-trainer / -rollout and must stay DNS-1035 labels with room for hashes.
    name: str = field("grpojob", description="Job name.", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                      max_length=40)
    namespace: Optional[str] = field(None, description="Namespace.")


class GRPOJob(Model):
    api_version: Literal["grpojob.io/v1alpha1"] = field(API_VERSION, description="API version.")
    kind: Literal["GRPOJob"] = field(KIND, description="Kind.")
    metadata: ObjectMeta = field(default_factory=ObjectMeta, description="Object metadata.")
    spec: GRPOJobSpec = field(description="Desired state.")
    status: Optional[GRPOJobStatus] = field(None, description="Observed state (written by the operator).")
