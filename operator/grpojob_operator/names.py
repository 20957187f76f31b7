"""Names, labels, annotations and paths the operator's children share (one home for each)."""
from __future__ import annotations

import os

from grpojob.api.spec import GROUP

# The runtime image the pods run unless the job names one; the Helm chart references this constant.
DEFAULT_IMAGE = "ghcr.io/grpojob/runtime:0.1.0"
IMAGE_ENV = "GRPOJOB_RUNTIME_IMAGE"  # operator-wide override (set by the chart)

MANAGER = "grpojob-operator"  # value of app.kubernetes.io/managed-by and the API field manager

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_ENVIRONMENT = f"{GROUP}/environment"  # an environment's pods: spec.environments[].name
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"  # set by the StatefulSet controller (k8s >= 1.28)

ANN_HASH = f"{GROUP}/spec-hash"  # hash of the rendered child: drift shows as a different hash
ANN_LEDGER = f"{GROUP}/restart-ledger"  # on the GRPOJob: container restarts already seen, per trainer and rollout pod

CONFIG_DIR = "/etc/grpojob"  # the ConfigMap mount
TOKEN_DIR = "/var/run/secrets/grpojob"  # the job's Secret, read-only (grpojob.auth)
RUN_DIR = "/var/run/grpojob"  # emptyDir for run-local files
MODELS_DIR = "/models"  # model PVC mount (see ModelSpec.volume_claim)
SITE_DIR = "/opt/grpojob/site"  # emptyDir that spec.code.pip is installed into (CODE_DIR: grpojob.api.spec)
SHM_DIR = "/dev/shm"
TMP_DIR = "/tmp"
# The runtime image's user and home (images/runtime/Dockerfile; a test keeps them equal).
RUNTIME_UID = 10001
HOME_DIR = "/home/grpojob"

# How the operator reaches a trainer leader; tests point it at a stand-in on 127.0.0.1.
TRAINER_URL_ENV = "GRPOJOB_TRAINER_URL"
TRAINER_URL = "http://{name}-trainer-0.{name}-trainer.{namespace}.svc:{port}"

ROLES = ("trainer", "rollout")

# Where the chart installs the operator, unless it says otherwise (GRPOJOB_OPERATOR_NAMESPACE).
DEFAULT_OPERATOR_NAMESPACE = "grpojob-system"
DEFAULT_MONITORING_NAMESPACES = ("monitoring",)


def runtime_image(override: str | None = None) -> str:
    return override or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def config_name(job: str) -> str:
    return f"{job}-config"


def trainer_name(job: str) -> str:
    return f"{job}-trainer"


def rollout_name(job: str) -> str:
    return f"{job}-rollout"


def environment_name(job: str, environment: str) -> str:
    return f"{job}-env-{environment}"


def token_name(job: str) -> str:
    """The job's Secret: its token, made once by the operator (never in the ConfigMap or status)."""
    return f"{job}-token"


def policy_name(job: str, role: str) -> str:
    """The NetworkPolicy guarding a role's pods."""
    return f"{job}-{role}"


def workload_name(job: str, role: str) -> str:
    return trainer_name(job) if role == "trainer" else rollout_name(job)


def trainer_host(job: str, namespace: str) -> str:
    """Trainer pod 0 through the headless Service: rendezvous and weight-sync store."""
    return f"{job}-trainer-0.{trainer_name(job)}.{namespace}.svc"


def common_labels(job: str) -> dict[str, str]:
    return {LABEL_NAME: "grpojob", LABEL_INSTANCE: job, LABEL_PART_OF: "grpojob",
            LABEL_MANAGED_BY: MANAGER, LABEL_JOB: job}


def selector(job: str, role: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_ROLE: role}


def environment_selector(job: str, environment: str) -> dict[str, str]:
    return {**selector(job, "environment"), LABEL_ENVIRONMENT: environment}
