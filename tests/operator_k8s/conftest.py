"""Fixtures: the kmock emulator (with our shim), a kubeconfig for it, acted-out cluster
controllers, the trainer stand-in, and the real operator running against them."""
from __future__ import annotations

import copy
from typing import Any, AsyncIterator, Callable

import kmock
import pytest
import yaml

from grpojob.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from grpojob_operator import children
from grpojob_operator import names as n
from grpojob_operator.config import OperatorConfig

from . import admission
from .cluster import Cluster
from .harness import OperatorThread, TrainerStub
from .kmock_shim import SECRETS, Emulator

NS = "ml"

# A small valid job; tests change what they exercise.
JOB_SPEC: dict[str, Any] = {
    "model": {"path": "/models/tiny"},
    "dataset": {"factory": "toy", "maxPromptLength": 32},
    "rewards": [{"name": "exact_match"}],
    "training": {"steps": 20, "promptsPerStep": 4, "microBatchTokens": 512},
    "trainer": {"replicas": 2, "processesPerReplica": 2},
    "rollout": {"replicas": 2, "backend": "hf", "sampling": {"maxTokens": 8}},
    # Two trainer pods write each checkpoint's shards into one directory: one shared claim.
    "checkpoint": {"volumeClaim": "grpo-checkpoints"},
}
# The default storage (a claim per trainer pod, the StatefulSet's volumeClaimTemplates), which
# one trainer pod needs: spread over job_manifest's trainer and checkpoint overrides.
ONE_POD = {"replicas": 1}
PER_POD: dict[str, Any] = {"volumeClaim": None}


def job_manifest(name: str, ns: str = NS, **spec_overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(JOB_SPEC)
    for key, value in spec_overrides.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) and isinstance(spec.get(key), dict) else value
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": ns}, "spec": spec}


def job_path(ns: str = NS, name: str = "") -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" + (f"/{name}" if name else "")


@pytest.fixture
async def emulator() -> AsyncIterator[Emulator]:
    """The API server: kmock, completed by the shim, with two admission plugins and the
    StatefulSet update validation acted out."""
    async with Emulator() as emu, kmock.Server(emu):
        admission.owner_references_permission_enforcement(emu)
        admission.pod_security_admission(emu)
        admission.statefulset_update_validation(emu)
        yield emu


@pytest.fixture
def kubeconfig(tmp_path, emulator: Emulator, monkeypatch) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return str(path)


@pytest.fixture
async def cluster(emulator: Emulator) -> AsyncIterator[Cluster]:
    async with Cluster(emulator) as c:
        yield c


def secret_token(emu: Emulator) -> Callable[[str, str], Any]:
    """A job's token as its pods read it: from the job's Secret in the emulator."""
    def read(ns: str, job: str) -> Any:
        obj = emu.get_obj(SECRETS, ns, n.token_name(job))
        return children.secret_token(obj) if obj else None
    return read


@pytest.fixture
async def trainer(emulator: Emulator) -> AsyncIterator[TrainerStub]:
    async with TrainerStub(token_of=secret_token(emulator)) as stub:
        yield stub


@pytest.fixture
def operator_config(trainer: TrainerStub) -> Callable[..., OperatorConfig]:
    def make(**kw: Any) -> OperatorConfig:
        base = dict(interval=0.2, trainer_url=trainer.url_template, trainer_timeout=1.0, suspend_timeout=5.0,
                    retry_delay=0.3, metrics_port=0, metrics_host="127.0.0.1", batch_window=0.02,
                    image="registry.test/grpojob:test")
        base.update(kw)
        return OperatorConfig(**base)
    return make


@pytest.fixture
async def operator(kubeconfig: str, cluster: Cluster, operator_config) -> AsyncIterator[OperatorThread]:
    op = OperatorThread(operator_config())
    await op.start()
    try:
        yield op
    finally:
        await op.stop()
