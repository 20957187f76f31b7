"""The one renderer: a GRPOJob becomes the processes to start.

The operator puts each Role into pods (StatefulSet / Deployment); `grpojob run` starts the same
commands with the same environment as local processes. The only input that differs is `Placement`:
where things run and which ports are free.
"""
from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field, replace
from typing import Optional

from grpojob.api.colocation import COLOCATED
from grpojob.api.plugins import CODE_DIR_ENV
from grpojob.api.spec import RENDEZVOUS_PORT, SYNC_STORE_PORT, GRPOJob
from grpojob.auth import ENV_METRICS_AUTH, ENV_TOKEN_FILE

# Environment contract read by the runtime processes.
ENV_CONFIG = "GRPOJOB_CONFIG"  # path of the runtime config (the job's JSON)
ENV_JOB = "GRPOJOB_JOB"
ENV_NAMESPACE = "GRPOJOB_NAMESPACE"
ENV_ROLE = "GRPOJOB_ROLE"
ENV_RUN_DIR = "GRPOJOB_RUN_DIR"  # run-local files: metrics.jsonl, final model
ENV_CHECKPOINT_DIR = "GRPOJOB_CHECKPOINT_DIR"
ENV_TRAINER_PORT = "GRPOJOB_TRAINER_PORT"  # trainer leader HTTP: /status /metrics /healthz
ENV_SYNC_ADDR = "GRPOJOB_SYNC_ADDR"  # host:port of the weight-sync TCPStore on trainer rank 0
ENV_ROLLOUT_PORT = "GRPOJOB_ROLLOUT_PORT"
ENV_ADVERTISE_HOST = "GRPOJOB_ADVERTISE_HOST"  # address the rollout server registers under
ENV_REPLICA_ID = "GRPOJOB_REPLICA_ID"
ENV_BACKEND = "GRPOJOB_ROLLOUT_BACKEND"
ENV_LOG_FORMAT = "GRPOJOB_LOG_FORMAT"
# spec.judges: a judge server's name and port; the trainer's map of judge name -> base URLs (JSON).
ENV_JUDGE = "GRPOJOB_JUDGE"
ENV_JUDGE_PORT = "GRPOJOB_JUDGE_PORT"
ENV_JUDGE_URLS = "GRPOJOB_JUDGE_URLS"
# Environments (spec.environments): their name, the trainer's trajectory API, the rollout servers'
# OpenAI endpoint (OPENAI_BASE_URL is what the `openai` client reads; the list holds every server).
ENV_ENVIRONMENT = "GRPOJOB_ENVIRONMENT"
ENV_TRAJECTORY_URL = "GRPOJOB_TRAJECTORY_URL"
ENV_OPENAI_BASE_URL = "OPENAI_BASE_URL"
ENV_OPENAI_BASE_URLS = "GRPOJOB_OPENAI_BASE_URLS"
# The job's token is the API key of the rollout servers' OpenAI endpoints: environment pods get it
# as OPENAI_API_KEY from the job's Secret; processes started by `grpojob run` read GRPOJOB_TOKEN_FILE.
ENV_OPENAI_API_KEY = "OPENAI_API_KEY"
# spec.placement colocated with GPUs on a cluster: the engine's command and its own environment (JSON),
# for the one container that runs it next to the trainer (grpojob.colocated_pod).
ENV_COLOCATED_ENGINE = "GRPOJOB_COLOCATED_ENGINE"

# The trajectory API is served on the trainer leader's HTTP port under this path.
TRAJECTORY_PREFIX = "/trajectories"
# spec.mode service: the training API, on the same port (grpojob.service.app, grpojob.client).
SERVICE_PREFIX = "/service"
# ... and Tinker's own wire, for the `tinker` SDK (grpojob.service.tinker_api).
TINKER_PREFIX = "/api/v1"
ENV_CODE_DIR = CODE_DIR_ENV  # spec.code's modules (on PYTHONPATH; relative file references start here)
ENV_SITE_DIR = "GRPOJOB_SITE_DIR"  # where spec.code.pip is installed (on PYTHONPATH)

# Per-replica values: the operator fills them from the downward API, `grpojob run` from its index.
REPLICA_INDEX = "index"  # trainer: StatefulSet pod ordinal
REPLICA_HOST = "host"  # rollout: pod IP
REPLICA_NAME = "name"  # rollout: pod name

CONFIG_FILE = "grpojob.json"  # file name inside the ConfigMap / run dir
# Every process of a job shares its cores with the others: a rollout server generates while the trainer
# waits, two servers share a node. OpenMP's default has idle worker threads spin; a torch process's
# threads then spin through the other processes' time slices, and every parallel region waits for a
# descheduled peer: on 2 cores two CPU rollout servers generated a step 16x slower than one (4.7 s
# against 0.29 s), instead of sharing the cores. Passive waiting sleeps at once. The user's own value
# (spec.*.env, or the caller's environment for `grpojob run`) wins.
THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}

# The trainer pod's terminationGracePeriodSeconds: the trainer checkpoints on SIGTERM before it exits,
# and a large model takes time to write.
TRAINER_GRACE_SECONDS = 300


@dataclass(frozen=True)
class Placement:
    """Where the job's processes run."""
    trainer_host: str  # address of trainer replica 0 (rendezvous and weight-sync store)
    config_path: str
    checkpoint_dir: str
    run_dir: str
    rendezvous_port: int = RENDEZVOUS_PORT
    sync_port: int = SYNC_STORE_PORT
    trainer_port: Optional[int] = None  # default: spec.trainer.port
    rollout_port: Optional[int] = None  # default: spec.rollout.port
    # Base URLs (http://host:port) at which environments reach the rollout servers: the rollout
    # Service on a cluster, each local server for `grpojob run`. Needed when spec.environments is set.
    rollout_urls: tuple[str, ...] = ()
    code_dir: Optional[str] = None  # spec.code's modules, when it has some
    site_dir: Optional[str] = None  # the writable directory spec.code.pip installs into
    # The file holding the job's token (grpojob.auth): the mounted Secret, or <run dir>/token.
    token_file: str = ""
    metrics_auth: bool = False  # /metrics needs the token too (the operator's chart value)
    # spec.judges: name -> base URLs the trainer scores at (the judge's Service on a cluster, each
    # local server for `grpojob run`); default http://<job>-judge-<name>:<port>.
    judge_urls: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Role:
    name: str  # trainer | rollout | env-<environment name> | judge-<judge name>
    replicas: int
    command: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    per_replica_env: dict[str, str] = field(default_factory=dict)  # ENV name -> REPLICA_* value
    environment: Optional[str] = None  # spec.environments[].name of an environment's role
    # Run once per replica before `command`, with the same environment (spec.code.pip): an init
    # container in pods, a step before the processes start with `grpojob run`.
    setup: Optional[list[str]] = None
    # The role whose pods this one's processes join (spec.placement colocated: the rollout server
    # is a second container of the trainer pod); None: pods of its own.
    pod_of: Optional[str] = None
    judge: Optional[str] = None  # spec.judges[].name of a judge's role


ENVIRONMENT_ROLE = "environment"  # GRPOJOB_ROLE of every environment process


def environment_role_name(name: str) -> str:
    return f"env-{name}"


def trajectory_url(trainer_host: str, trainer_port: int) -> str:
    """The trajectory API's base URL: the trainer leader's HTTP port."""
    return f"http://{trainer_host}:{trainer_port}{TRAJECTORY_PREFIX}"


def bind_host(address: str) -> str:
    """Where a server listens, given the address peers reach it at: loopback stays on loopback
    (local runs), anything else listens on every interface (pods behind a Service)."""
    try:
        return "127.0.0.1" if ipaddress.ip_address(address).is_loopback else "0.0.0.0"
    except ValueError:  # a DNS name
        return "127.0.0.1" if address == "localhost" else "0.0.0.0"


def trainer_command() -> list[str]:
    # torchrun (run by grpojob.trainer.launch: SIGTERM goes to the ranks, so a trainer stopped
    # after its job is done exits 0) takes --nnodes/--nproc-per-node/--node-rank/--master-* from
    # PET_* variables, so the command is the same on every pod and locally.
    return ["grpojob", "torchrun"]


def rollout_command() -> list[str]:
    return ["grpojob", "rollout"]


def judge_command() -> list[str]:
    return ["grpojob", "judge"]


def judge_role_name(name: str) -> str:
    return f"judge-{name}"


def colocated_pod_command() -> list[str]:
    return ["grpojob", "colocated-pod"]


def install_code_command() -> list[str]:
    return ["grpojob", "install-code"]


def code_env(job: GRPOJob, where: Placement) -> dict[str, str]:
    """The environment that brings spec.code into a process: PYTHONPATH and where things are."""
    env, path = {}, []
    if where.code_dir:
        env[ENV_CODE_DIR] = where.code_dir
        path.append(where.code_dir)
    if job.spec.code.pip and where.site_dir:
        env[ENV_SITE_DIR] = where.site_dir
        path.append(where.site_dir)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def roles(job: GRPOJob, where: Placement) -> list[Role]:
    spec = job.spec
    if not where.token_file:
        raise ValueError("Placement.token_file: every process of a job needs the job's token file")
    trainer_port = where.trainer_port or spec.trainer.port
    rollout_port = where.rollout_port or spec.rollout.port
    base = {
        ENV_CONFIG: where.config_path,
        ENV_JOB: job.metadata.name,
        ENV_NAMESPACE: job.metadata.namespace or "default",
        ENV_LOG_FORMAT: spec.monitoring.log_format,
        ENV_TOKEN_FILE: where.token_file,  # the file's path: the token itself is never in the env
        "PYTHONUNBUFFERED": "1",
        **THREAD_ENV,
    }
    # spec.code reaches every process of the job the same way: trainer, rollout and environments.
    base.update(code_env(job, where))
    setup = install_code_command() if spec.code.pip else None
    common = {
        **base,
        ENV_RUN_DIR: where.run_dir,
        ENV_CHECKPOINT_DIR: where.checkpoint_dir,
        ENV_SYNC_ADDR: f"{where.trainer_host}:{where.sync_port}",
        ENV_TRAINER_PORT: str(trainer_port),
    }
    if where.metrics_auth:
        common[ENV_METRICS_AUTH] = "true"
    judges = judge_roles(job, where, {**base, **({ENV_METRICS_AUTH: "true"} if where.metrics_auth else {})}, setup)
    trainer_judges = {ENV_JUDGE_URLS: judge_urls(job, where)} if spec.judges else {}
    trainer = Role(
        name="trainer",
        replicas=spec.trainer.replicas,
        command=trainer_command(),
        env={**common, ENV_ROLE: "trainer",
             "PET_NNODES": str(spec.trainer.replicas),
             "PET_NPROC_PER_NODE": str(spec.trainer.processes_per_replica),
             "PET_MASTER_ADDR": where.trainer_host,
             "PET_MASTER_PORT": str(where.rendezvous_port),
             "PET_MAX_RESTARTS": "0", **trainer_judges},
        ports={"rendezvous": where.rendezvous_port, "sync": where.sync_port, "http": trainer_port},
        per_replica_env={"PET_NODE_RANK": REPLICA_INDEX},
        setup=setup,
    )
    rollout = Role(
        name="rollout",
        replicas=spec.rollout.replicas,
        command=rollout_command(),
        env={**common, ENV_ROLE: "rollout", ENV_ROLLOUT_PORT: str(rollout_port),
             ENV_BACKEND: spec.rollout.backend,
             # agent sessions' turns are recorded by the trainer (grpojob.rollout.sessions)
             ENV_TRAJECTORY_URL: trajectory_url(where.trainer_host, trainer_port)},
        ports={"http": rollout_port},
        per_replica_env={ENV_ADVERTISE_HOST: REPLICA_HOST, ENV_REPLICA_ID: REPLICA_NAME},
        setup=setup,
    )
    if spec.placement == COLOCATED:
        # In the trainer's pod (one network namespace, one /dev/shm): the trainer reaches its engine on
        # loopback, and nothing outside the pod does.
        rollout = replace(rollout, env={**rollout.env, ENV_ADVERTISE_HOST: "127.0.0.1"},
                          per_replica_env={ENV_REPLICA_ID: REPLICA_NAME}, pod_of=trainer.name)
    return [trainer, rollout, *environment_roles(job, where, base, trainer_port, setup), *judges]


def one_container(trainer: Role, engine: Role, engine_env: Optional[dict[str, str]] = None) -> Role:
    """spec.placement colocated where the trainer's pod has GPUs: a device plugin gives them to one
    container only, so the trainer and its engine run in one container under grpojob.colocated_pod.
    The container has the trainer's environment; the engine's command and the variables it sets
    otherwise (its own, then `engine_env`: the user's spec.rollout.env) travel as JSON."""
    own = {k: v for k, v in engine.env.items() if trainer.env.get(k) != v}
    doc = {"command": list(engine.command), "env": {**own, **(engine_env or {})}}
    return replace(trainer, command=colocated_pod_command(),
                   env={**trainer.env, ENV_COLOCATED_ENGINE: json.dumps(doc, sort_keys=True)},
                   per_replica_env={**engine.per_replica_env, **trainer.per_replica_env})


def environment_roles(job: GRPOJob, where: Placement, base: dict[str, str], trainer_port: int,
                      setup: Optional[list[str]] = None) -> list[Role]:
    """One role per spec.environments entry: its command, the rollout servers' OpenAI endpoint and
    the trajectory API; the job's token file and spec.code come with `base` and `setup`, as for
    the other roles."""
    if not job.spec.environments:
        return []
    if not where.rollout_urls:
        raise ValueError("Placement.rollout_urls is empty: environments need the rollout servers' address")
    openai = [f"{u.rstrip('/')}/v1" for u in where.rollout_urls]
    env = {**base, ENV_ROLE: ENVIRONMENT_ROLE,
           ENV_TRAJECTORY_URL: trajectory_url(where.trainer_host, trainer_port),
           ENV_OPENAI_BASE_URL: openai[0], ENV_OPENAI_BASE_URLS: ",".join(openai)}
    return [Role(name=environment_role_name(e.name), replicas=e.replicas, command=list(e.command),
                 env={**env, ENV_ENVIRONMENT: e.name}, ports={},
                 per_replica_env={ENV_REPLICA_ID: REPLICA_NAME}, environment=e.name, setup=setup)
            for e in job.spec.environments]


def judge_urls(job: GRPOJob, where: Placement) -> str:
    """The trainer's GRPOJOB_JUDGE_URLS: {judge name: [base URL, ...]} as JSON."""
    urls = {j.name: list(where.judge_urls.get(j.name) or (f"http://{job.metadata.name}-{judge_role_name(j.name)}:"
                                                         f"{j.port}",)) for j in job.spec.judges}
    return json.dumps(urls, sort_keys=True)


def judge_roles(job: GRPOJob, where: Placement, base: dict[str, str], setup: Optional[list[str]] = None) -> list[Role]:
    """One role per spec.judges entry: `grpojob judge` with the judge's name and port. Judges take
    no part in weight sync (no sync address): their weights are frozen."""
    return [Role(name=judge_role_name(j.name), replicas=j.replicas, command=judge_command(),
                 env={**base, ENV_ROLE: "judge", ENV_JUDGE: j.name, ENV_JUDGE_PORT: str(j.port)},
                 ports={"http": j.port}, per_replica_env={ENV_ADVERTISE_HOST: REPLICA_HOST, ENV_REPLICA_ID: REPLICA_NAME},
                 setup=setup, judge=j.name)
            for j in job.spec.judges]


def render_config(job: GRPOJob) -> str:
    """The runtime config every process reads: the job with all defaults filled in."""
    doc = job.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
