"""What the monitoring tests scrape: a real `grpojob run` (trainer leader and rollout server on local
ports), and the real operator reconciling the same job against the kmock API emulator.

The operator reads the running trainer's /status (its trainer URL points at the local trainer
leader) with the job's token, so its per-job gauges come from the same run: the test gives the
job's Secret the run's token before the operator starts (acted out: the operator makes the Secret
only when there is none, and then reads it back). No cluster runs the pods: the tests act out
the StatefulSet and Deployment controllers and the kubelet (tests/operator_k8s/cluster.py); the pods
they make are what the Prometheus test's acted-out service discovery reads.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import kmock
import yaml

from grpojob.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from grpojob import auth
from grpojob.auth import Auth
from grpojob.local.runner import ENDPOINTS_FILE, token_path
from grpojob_operator import children
from grpojob_operator.config import OperatorConfig
from tests.local.test_run import EXAMPLE, grpojob_run, processes_of
from tests.operator_k8s.cluster import Cluster
from tests.operator_k8s.harness import OperatorThread
from tests.operator_k8s.kmock_shim import PODS, Emulator

NAMESPACE = "ml"
JOB = "tiny-local"  # examples/tiny-local.yaml's name, the GRPOJob the operator sees too
STEPS = 10000  # far more than the tests wait for: the run is alive while it is scraped
# spec.evaluation: the initial policy's evaluation is reported before the first step (its panels have data)
EVALUATION = ("evaluation.dataset.factory=toy", "evaluation.dataset.args.size=8",
              "evaluation.dataset.maxPromptLength=32", "evaluation.atStart=true", "evaluation.everySteps=5", "evaluation.samplesPerPrompt=2")


class Background:
    """An event loop in a thread, for the emulator and the acted-out controllers (the operator
    runs kopf in a thread of its own)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="monitoring-bg", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Scene:
    def __init__(self, workdir: Path, model_dir: Path):
        self.workdir, self.model_dir = workdir, model_dir
        self.run_dir = workdir / "run"
        self.proc: Optional[subprocess.Popen] = None
        self.endpoints: dict[str, str] = {}
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self.bg = Background()
        self.stack = contextlib.AsyncExitStack()
        self.emu: Optional[Emulator] = None
        self.cluster: Optional[Cluster] = None
        self.operator: Optional[OperatorThread] = None
        self._kubeconfig_before = os.environ.get("KUBECONFIG")

    # ---- the local run ----------------------------------------------------------------------
    def start_run(self) -> None:
        # A learning rate too small to converge: tiny-local learns its task in about a hundred steps,
        # after which every group scores alike and steps are skipped (no entropy, clip fraction or
        # gradient to export), which is the truth but leaves the dashboard's panels empty.
        self.proc = grpojob_run(self.run_dir, f"model.path={self.model_dir}", f"training.steps={STEPS}",
                                "checkpoint.everySteps=100000", "training.learningRate=1e-7", *EVALUATION,
                                cwd=self.workdir)
        # Drain its output (a full pipe would stall the run); keep the tail for error messages.
        threading.Thread(target=lambda: self.output.extend(self.proc.stdout), daemon=True).start()

    def wait_run(self, timeout: float = 240) -> None:
        """Until endpoints.json names the trainer leader and it answers /metrics."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            path = self.run_dir / ENDPOINTS_FILE
            if path.exists() and not self.endpoints:  # the processes that export /metrics (not the trajectory API)
                self.endpoints = {name: url for name, url in json.loads(path.read_text()).items()
                                  if name.startswith(("trainer-", "rollout-"))}
            if self.endpoints and all(_answers(url + "/metrics") for url in self.endpoints.values()):
                return
            time.sleep(0.3)
        raise AssertionError(f"the run's endpoints did not answer within {timeout}s: {self.endpoints}")

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"grpojob run ended early ({self.proc.returncode}):\n{''.join(self.output)}")

    def trainer_status(self) -> dict[str, Any]:
        req = urllib.request.Request(self.endpoints["trainer-0"] + "/status",
                                     headers=Auth(self.token()).headers())
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def token(self) -> str:
        return auth.read_file(token_path(self.run_dir))

    def wait_steps(self, n: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if self.trainer_status().get("step", 0) >= n:
                return
            time.sleep(0.3)
        raise AssertionError(f"the trainer did not reach step {n} within {timeout}s")

    @property
    def trainer_port(self) -> int:
        return int(self.endpoints["trainer-0"].rsplit(":", 1)[1])

    # ---- the operator -----------------------------------------------------------------------
    def start_emulator(self) -> None:
        async def up() -> None:
            self.emu = await self.stack.enter_async_context(Emulator())
            await self.stack.enter_async_context(kmock.Server(self.emu))
            self.cluster = await self.stack.enter_async_context(Cluster(self.emu))
        self.bg.run(up())
        kubeconfig = self.workdir / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(self.emu.url).rstrip("/")}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}]}))
        os.environ["KUBECONFIG"] = str(kubeconfig)

    def start_operator(self) -> None:
        # The trainer URL template points every job at the local trainer leader (port: spec.trainer.port).
        cfg = OperatorConfig(interval=0.3, trainer_url="http://127.0.0.1:{port}", trainer_timeout=2.0,
                             suspend_timeout=5.0, retry_delay=0.3, metrics_port=0, metrics_host="127.0.0.1",
                             batch_window=0.02, image="registry.test/grpojob:test")
        self.operator = OperatorThread(cfg)
        self.bg.run(self.operator.start())

    @property
    def operator_url(self) -> str:
        assert self.operator is not None and self.operator.controller is not None
        return f"http://127.0.0.1:{self.operator.controller.metrics.port}"

    def create_job(self) -> None:
        """The run's job, created in the emulator with the local trainer's port, and its Secret
        holding the run's token (before the operator starts)."""
        doc = yaml.safe_load(EXAMPLE.read_text())
        doc["metadata"] = {"name": JOB, "namespace": NAMESPACE}
        spec = doc["spec"]
        spec["training"]["steps"] = STEPS
        spec.setdefault("trainer", {})["port"] = self.trainer_port
        assert self.cluster is not None and doc["apiVersion"] == API_VERSION and doc["kind"] == KIND
        job = self.bg.run(self.cluster.create(f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}", doc))
        secret = children.token_secret(JOB, NAMESPACE, children.owner_reference(JOB, job["metadata"]["uid"]),
                                       self.token())
        self.bg.run(self.cluster.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret))

    def run_pods(self) -> None:
        """The job's pods, made by the operator's workloads, Running."""
        deadline = time.monotonic() + 60
        while len(self.pods()) < 2:
            assert time.monotonic() < deadline, f"no trainer and rollout pods after 60s: {self.pods()}"
            time.sleep(0.1)
        self.bg.run(self.cluster.run_pods(NAMESPACE, JOB))

    def wait_operator_reports(self, timeout: float = 60) -> None:
        """Until the operator has read the trainer's progress (its per-job step gauge is >= 1)."""
        assert self.operator is not None and self.operator.controller is not None
        metrics = self.operator.controller.metrics
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = metrics.exposition().decode()
            found = re.search(rf'^grpojob_job_step{{job="{JOB}",namespace="{NAMESPACE}"}} (\S+)$', text, re.M)
            if found and float(found.group(1)) >= 1:
                return
            time.sleep(0.2)
        raise AssertionError(f"the operator did not report the trainer's progress within {timeout}s")

    def pods(self) -> list[dict[str, Any]]:
        assert self.emu is not None
        return self.emu.live(PODS, NAMESPACE)

    # ---- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        try:
            if self.operator is not None:
                self.bg.run(self.operator.stop())
            self.bg.run(self.stack.aclose())
        finally:
            self.bg.close()
            if self._kubeconfig_before is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = self._kubeconfig_before
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            for pid in processes_of(self.run_dir):  # the trainer ranks live in sessions of their own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
