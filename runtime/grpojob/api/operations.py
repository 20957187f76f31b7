"""How a GRPOJob is operated: checkpoints, run policy, scheduling, monitoring, the user's code and
the network policy. Part of the spec (api/spec.py), kept apart from what the job trains."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import StringConstraints, ValidationInfo, field_validator, model_validator

from grpojob.api import data_url, plugins
from grpojob.api.base import Model, deferring, field, invalid, invalid_all
from grpojob.api.names import LABEL_VALUE_MAX, ObjectName
from grpojob.api.workload import RESERVED_VOLUME_PREFIX, Volume

CODE_DIR = "/opt/grpojob/code"  # spec.code's modules in the pods

PERSISTENT, EPHEMERAL = "persistent", "ephemeral"  # checkpoint.storage
# A Kubernetes resource quantity (the API's own pattern for Quantity).
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"


CHECKPOINT_STORES = ("s3", "gs", "az", "abfs", "abfss")  # written through obstore (checkpoint.store_dcp)


def store_url(v: str) -> None:
    """ValueError unless `v` is an object-store URL checkpoints can be written to."""
    scheme, rest = v.split("://", 1)
    if scheme.lower() not in CHECKPOINT_STORES:
        raise ValueError(f"'{scheme}://' is not a store checkpoints are written to: use a directory (a mounted "
                         f"volume) or s3://, gs://, az://<bucket>/<prefix>")
    bucket = rest.split("/", 1)[0]
    if any(c.isspace() for c in v) or "?" in v or "#" in v:
        raise ValueError(f"'{v}': an object-store prefix is a plain path (no white space, '?' or '#')")
    if not data_url.BUCKET.match(bucket):
        raise ValueError(f"'{v}' names no valid bucket or container ({scheme}://<bucket>/<prefix>)")


class CheckpointSpec(Model):
    volume_claim: Optional[ObjectName] = field(None, description="An existing PersistentVolumeClaim for checkpoints, "
                                        "mounted at path in trainer pods (and rollout pods with backend "
                                        "checkpoint). Unset: storage decides.")
    storage: Literal["persistent", "ephemeral"] = field(
        PERSISTENT, description="Where trainer pods keep checkpoints without volumeClaim. persistent: a "
        "PersistentVolumeClaim per trainer pod (size, storageClassName), kept while the job is "
        "suspended and deleted with the job; the cluster needs a "
        "default StorageClass unless storageClassName names one. ephemeral: an emptyDir, deleted with its "
        "pod: a restart keeps it, but suspend would lose it, so suspend is refused.")
    size: str = field("10Gi", description="Size of each trainer pod's checkpoint claim (storage persistent): "
                      "room for keepLast checkpoints of model and optimizer.", pattern=QUANTITY_PATTERN,
                      max_length=64)
    storage_class_name: Optional[ObjectName] = field(None, description="StorageClass of the checkpoint claims "
                                                     "(storage persistent); unset: the cluster's default "
                                                     "StorageClass.")
    path: str = field("/checkpoints", description="Checkpoint directory (locally: in the run dir), or "
                      "s3://, gs://, az://<bucket>/<prefix>.")
    credentials_secret: Optional[ObjectName] = field(
        None, description="Object-store path: a Secret of its credentials (trainer env).")
    every_steps: int = field(50, ge=1, description="Save every N steps (and always at the end).")
    keep_last: int = field(3, ge=1, description="Keep the newest K.")
    resume: bool = field(True, description="Resume from the newest checkpoint when one exists.")

    @field_validator("path")
    @classmethod
    def _location(cls, v: str) -> str:
        # Taken as a directory, "s3://b/p" became a local folder named "s3:": every URL is checked.
        if data_url.is_url(v):
            store_url(v)
        return v

    @property
    def in_store(self) -> bool:
        """Checkpoints in an object store (no volume for them)."""
        return data_url.is_url(self.path)

    @model_validator(mode="after")
    def _storage(self, info: ValidationInfo) -> "CheckpointSpec":
        if deferring(info):
            return self
        if self.volume_claim and self.storage == EPHEMERAL:
            raise invalid("storage", "ephemeral contradicts volumeClaim (checkpoints on that claim); "
                          "remove one of them")
        if self.volume_claim and self.in_store:
            raise invalid("volumeClaim", f"mounts a directory, but path {self.path} is an object store; remove "
                          "one of them")
        if self.credentials_secret and not self.in_store:
            raise invalid("credentialsSecret", "is for an object-store path (s3://, gs://, az://); a directory "
                          "needs none")
        return self


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
    gang: Literal["none", "kueue", "volcano"] = field(
        "none", description="Gang scheduling: trainer and rollout pods are admitted together or not at all. "
        "kueue: every pod of the job is in one Kueue plain-pod group (its size in every pod: changing "
        "rollout.replicas of a running job is refused; suspend, edit, resume); volcano: one PodGroup of "
        "trainer and rollout pods.")
    # A queue is an object (a DNS-1123 subdomain) whose name Kueue reads from a label (a label value:
    # at most 63 characters).
    queue_name: Optional[ObjectName] = field(None, description="Kueue LocalQueue or Volcano queue.",
                                             max_length=LABEL_VALUE_MAX)
    scheduler_name: Optional[ObjectName] = field(None, description="Pod scheduler (volcano sets it by default).")


TRACKERS = ("tensorboard", "wandb", "mlflow")


class MonitoringSpec(Model):
    pod_monitor: bool = field(False, description="Create a Prometheus Operator PodMonitor for the job's pods.")
    log_format: Literal["json", "text"] = field("json", description="Structured log format of the processes.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = field(
        default_factory=list, description="Experiment trackers fed every step's record by the trainer leader: "
        "tensorboard (event files in the run dir's tensorboard/), wandb (WANDB_* variables apply; offline in "
        "the run dir's wandb/ unless WANDB_MODE or WANDB_API_KEY says otherwise), mlflow (MLFLOW_TRACKING_URI, "
        "default a file store in the run dir's mlruns/). Needs the `trackers` extra.")
    callbacks: list[str] = field(default_factory=list, description="Callback classes ('module:Class' or "
                                 "'path/to/file.py:Class'), constructed without arguments, with "
                                 "on_step_end(record) and on_checkpoint(step, path), called on the trainer leader.")

    @field_validator("report_to")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("names a tracker twice")
        return v

    @field_validator("callbacks")
    @classmethod
    def _callbacks(cls, v: list[str]) -> list[str]:
        problems = [(f"[{i}]", err) for i, name in enumerate(v) if (err := plugins.check_name("callback", name))]
        if problems:
            raise invalid_all(problems)
        return v


class CodeSpec(Model):
    """User code in every pod: modules on PYTHONPATH, pip requirements, and (per role) an image."""

    config_map: Optional[ObjectName] = field(None, description="A ConfigMap whose keys are Python files (kubectl "
                                             f"create configmap NAME --from-file=DIR), mounted at {CODE_DIR} and put "
                                             "on PYTHONPATH in every pod.")
    volume: Optional[Volume] = field(None, description=f"A Kubernetes volume of Python code (any source: a "
                                     f"PersistentVolumeClaim, a ConfigMap with items...) mounted at {CODE_DIR} "
                                     "and put on PYTHONPATH in every pod; instead of configMap.")
    local_path: Optional[str] = field(None, description="`grpojob run`: the directory put on PYTHONPATH in place "
                                      "of configMap or volume (relative to where it is started); pods ignore it.")
    pip: list[str] = field(default_factory=list, description="pip requirements installed when a pod starts (an init "
                           "container, into an emptyDir on PYTHONPATH) and by `grpojob run` (into the run dir).")
    pip_args: list[str] = field(default_factory=list, description="Extra pip install arguments, e.g. "
                                "[--index-url, URL] or [--no-index, --find-links, /opt/grpojob/code/wheels].")

    @model_validator(mode="after")
    def _one_source(self, info: ValidationInfo) -> "CodeSpec":
        if deferring(info):
            return self
        problems = []
        if self.config_map is not None and self.volume is not None:
            problems.append(("volume", "set configMap or volume, not both"))
        name = (self.volume or {}).get("name", "")
        if name.startswith(RESERVED_VOLUME_PREFIX):
            problems.append(("volume.name", f"'{name}': names starting with {RESERVED_VOLUME_PREFIX} are reserved "
                             "for the operator's volumes"))
        if problems:
            raise invalid_all(problems)
        return self

    @property
    def has_modules(self) -> bool:
        """Pods get a code directory (a local run: when localPath is set)."""
        return self.config_map is not None or self.volume is not None


Namespace = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]


class NetworkSpec(Model):
    """Who may reach the job's pods (Kubernetes NetworkPolicies the operator creates)."""

    policy: bool = field(True, description="Create the job's NetworkPolicies: trainer ports accept only "
                         "the job's own pods and the operator's namespace; rollout ports only the job's "
                         "trainer (and environment) pods and agentNamespaces; the metrics port also the "
                         "monitoring namespaces. Every endpoint but the health probes also needs the job's "
                         "token (the Secret <name>-token), whatever this says.")
    agent_namespaces: list[Namespace] = field(default_factory=list, description="Namespaces whose pods may call "
                                        "the rollout servers (OpenAI endpoints, /generate), e.g. where agents "
                                        "run, and in mode service the trainer's HTTP port (the training API, where "
                                        "the user's loop runs); they still need the job's token.")
    monitoring_namespaces: Optional[list[Namespace]] = field(
        None, description="Namespaces whose pods may scrape the metrics port (Prometheus); default: the "
        "operator's setting (chart value networkPolicy.monitoringNamespaces).")
