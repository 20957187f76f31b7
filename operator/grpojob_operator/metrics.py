"""The operator's Prometheus metrics: reconciles, errors, jobs by phase, and per-job gauges, so one
scrape of the operator shows every job."""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpojob import prom
from grpojob.api import GRPOJobStatus
from grpojob.api.spec import TrainingSpec
from grpojob.api.status import PHASES, Progress
from grpojob.metrics_names import OPERATOR

log = logging.getLogger("grpojob.operator.metrics")

_JOB_GAUGES = ("grpojob_job_step", "grpojob_job_total_steps", "grpojob_job_reward_mean",
               "grpojob_job_policy_lag", "grpojob_job_trainer_ready", "grpojob_job_rollout_ready",
               "grpojob_job_restarts", "grpojob_job_rollout_desired", "grpojob_job_autoscale_wait_fraction",
               "grpojob_job_autoscale_idle_fraction")
# Counters start at 0 for every label value they can take, so a panel shows 0 (and rate() sees
# the first increase) rather than "no data" before anything went wrong.
RECONCILE_RESULTS = ("success", "invalid", "error")
CHILD_KINDS = ("ConfigMap", "Service", "StatefulSet", "Deployment", "PodGroup", "PodMonitor", "NetworkPolicy")
_DEFAULT_STEPS = TrainingSpec.model_fields["steps"].default


def total_steps(spec: Optional[Mapping[str, Any]]) -> Optional[int]:
    """spec.training.steps of a raw GRPOJob spec (its default when left out); None when unreadable."""
    if not isinstance(spec, Mapping):
        return None
    training = spec.get("training")
    steps = training.get("steps", _DEFAULT_STEPS) if isinstance(training, Mapping) else _DEFAULT_STEPS
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


def policy_lag(p: Progress) -> Optional[float]:
    """Versions the slowest rollout server is behind: from the per-server lags when the trainer
    reports them, else 0 or 1 from weightsInSync; None when the trainer said nothing yet."""
    lags = [r.lag for r in p.rollouts if r.lag is not None]
    if lags:
        return float(max(lags))
    return None if p.weights_in_sync is None else (0.0 if p.weights_in_sync else 1.0)


class OperatorMetrics:
    def __init__(self) -> None:
        self.m = prom.build(OPERATOR)
        self.registry = self.m["_registry"]
        self._phases: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            self.m["grpojob_operator_jobs"].labels(phase=phase).set(0)
        for result in RECONCILE_RESULTS:
            self.m["grpojob_operator_reconciles_total"].labels(result=result)
        for kind in CHILD_KINDS:
            self.m["grpojob_operator_child_errors_total"].labels(kind=kind)
        self._runner: Optional[web.AppRunner] = None
        self.port: Optional[int] = None

    def reconciled(self, result: str, seconds: float) -> None:
        self.m["grpojob_operator_reconciles_total"].labels(result=result).inc()
        self.m["grpojob_operator_reconcile_seconds"].observe(seconds)

    def child_error(self, kind: str) -> None:
        self.m["grpojob_operator_child_errors_total"].labels(kind=kind).inc()

    def job(self, namespace: str, name: str, st: GRPOJobStatus,
            spec: Optional[Mapping[str, Any]] = None) -> None:
        """The job's gauges from its status, and total steps from its spec (`spec`, the raw
        GRPOJob spec), known from creation on. A value not known yet has no sample."""
        self._phases[(namespace, name)] = st.phase
        self._count_phases()
        g, lbl = self.m, {"namespace": namespace, "job": name}
        p = st.progress
        a = st.autoscale
        optional = {"grpojob_job_total_steps": total_steps(spec) or p.total_steps or None,
                    "grpojob_job_reward_mean": p.reward_mean, "grpojob_job_policy_lag": policy_lag(p),
                    "grpojob_job_autoscale_wait_fraction": a.wait_fraction if a else None,
                    "grpojob_job_autoscale_idle_fraction": a.idle_fraction if a else None}
        for metric, value in optional.items():
            if value is None:
                _remove(g[metric], namespace, name)
            else:
                g[metric].labels(**lbl).set(value)
        g["grpojob_job_step"].labels(**lbl).set(p.step)
        g["grpojob_job_trainer_ready"].labels(**lbl).set(st.trainer.ready)
        g["grpojob_job_rollout_ready"].labels(**lbl).set(st.rollout.ready)
        g["grpojob_job_rollout_desired"].labels(**lbl).set(st.rollout.desired)
        g["grpojob_job_restarts"].labels(**lbl).set(st.restarts)

    def forget(self, namespace: str, name: str) -> None:
        if self._phases.pop((namespace, name), None) is None:
            return
        self._count_phases()
        for metric in _JOB_GAUGES:
            _remove(self.m[metric], namespace, name)

    def _count_phases(self) -> None:
        counts = {phase: 0 for phase in PHASES}
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            self.m["grpojob_operator_jobs"].labels(phase=phase).set(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on the operator's event loop; returns the bound port (0 picks a free one)."""
        async def handle(_: web.Request) -> web.Response:
            return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("serving metrics on %s:%d/metrics", host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _remove(metric: Any, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
