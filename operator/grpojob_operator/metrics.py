"""The operator's Prometheus metrics: reconciles, errors, jobs by phase, and per-job gauges, so one
scrape of the operator shows every job."""
from __future__ import annotations

import logging
from typing import Optional

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpojob import prom
from grpojob.api import GRPOJobStatus
from grpojob.api.status import PHASES
from grpojob.metrics_names import OPERATOR

log = logging.getLogger("grpojob.operator.metrics")

_JOB_GAUGES = ("grpojob_job_step", "grpojob_job_total_steps", "grpojob_job_reward_mean",
               "grpojob_job_policy_lag", "grpojob_job_trainer_ready", "grpojob_job_rollout_ready",
               "grpojob_job_restarts")


class OperatorMetrics:
    def __init__(self) -> None:
        self.m = prom.build(OPERATOR)
        self.registry = self.m["_registry"]
        self._phases: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            self.m["grpojob_operator_jobs"].labels(phase=phase).set(0)
        self._runner: Optional[web.AppRunner] = None
        self.port: Optional[int] = None

    def reconciled(self, result: str, seconds: float) -> None:
        self.m["grpojob_operator_reconciles_total"].labels(result=result).inc()
        self.m["grpojob_operator_reconcile_seconds"].observe(seconds)

    def child_error(self, kind: str) -> None:
        self.m["grpojob_operator_child_errors_total"].labels(kind=kind).inc()

    def job(self, namespace: str, name: str, st: GRPOJobStatus) -> None:
        self._phases[(namespace, name)] = st.phase
        self._count_phases()
        g, lbl = self.m, {"namespace": namespace, "job": name}
        p = st.progress
        g["grpojob_job_step"].labels(**lbl).set(p.step)
        g["grpojob_job_total_steps"].labels(**lbl).set(p.total_steps)
        g["grpojob_job_reward_mean"].labels(**lbl).set(p.reward_mean if p.reward_mean is not None else float("nan"))
        # TrainerStatus reports whether every rollout serves the newest policy, not how far behind
        # the slowest is: 0 when in sync, at least 1 when not.
        lag = float("nan") if p.weights_in_sync is None else (0.0 if p.weights_in_sync else 1.0)
        g["grpojob_job_policy_lag"].labels(**lbl).set(lag)
        g["grpojob_job_trainer_ready"].labels(**lbl).set(st.trainer.ready)
        g["grpojob_job_rollout_ready"].labels(**lbl).set(st.rollout.ready)
        g["grpojob_job_restarts"].labels(**lbl).set(st.restarts)

    def forget(self, namespace: str, name: str) -> None:
        if self._phases.pop((namespace, name), None) is None:
            return
        self._count_phases()
        for metric in _JOB_GAUGES:
            try:
                self.m[metric].remove(namespace, name)
            except KeyError:
                pass

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
