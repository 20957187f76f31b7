"""Operator settings: defaults for a cluster, overridable by environment (the chart) or by tests."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from . import names as n
from .children import Cluster

# Set by the chart: the operator pod's namespace (downward API), networkPolicy.monitoringNamespaces
# (comma-separated) and jobs.metricsAuth.
ENV_NAMESPACE = "GRPOJOB_OPERATOR_NAMESPACE"
ENV_MONITORING_NAMESPACES = "GRPOJOB_MONITORING_NAMESPACES"
ENV_JOBS_METRICS_AUTH = "GRPOJOB_JOBS_METRICS_AUTH"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: must be a number of seconds") from None


def _env_list(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


@dataclass
class OperatorConfig:
    image: str = field(default_factory=n.runtime_image)
    interval: float = 10.0  # seconds between status looks at each job (trainer /status, pods)
    trainer_url: str = n.TRAINER_URL  # template with {name} {namespace} {port}
    trainer_timeout: float = 3.0
    suspend_timeout: float = 600.0  # wait this long for the trainer's checkpoint before scaling down
    retry_delay: float = 5.0  # after a failed reconcile
    metrics_port: Optional[int] = 8080  # None: no metrics server
    metrics_host: str = "0.0.0.0"
    batch_window: Optional[float] = None  # kopf's event batching; None keeps kopf's default
    # What the jobs' children depend on beyond their spec (the chart sets these):
    namespace: str = n.DEFAULT_OPERATOR_NAMESPACE  # the operator's own: it may reach trainer ports
    monitoring_namespaces: tuple[str, ...] = n.DEFAULT_MONITORING_NAMESPACES  # may reach metrics ports
    metrics_auth: bool = False  # the jobs' /metrics need their token too

    @property
    def cluster(self) -> Cluster:
        return Cluster(self.namespace, tuple(self.monitoring_namespaces), self.metrics_auth)

    @classmethod
    def from_env(cls, **overrides) -> "OperatorConfig":
        cfg = cls(
            interval=_env_float("GRPOJOB_OPERATOR_INTERVAL", cls.interval),
            trainer_url=os.environ.get(n.TRAINER_URL_ENV) or n.TRAINER_URL,
            trainer_timeout=_env_float("GRPOJOB_TRAINER_TIMEOUT", cls.trainer_timeout),
            suspend_timeout=_env_float("GRPOJOB_SUSPEND_TIMEOUT", cls.suspend_timeout),
            namespace=os.environ.get(ENV_NAMESPACE) or n.DEFAULT_OPERATOR_NAMESPACE,
            monitoring_namespaces=_env_list(ENV_MONITORING_NAMESPACES, n.DEFAULT_MONITORING_NAMESPACES),
            metrics_auth=_env_bool(ENV_JOBS_METRICS_AUTH),
        )
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg
