"""Build prometheus-client metrics from the tables in metrics_names (imports prometheus_client)."""
from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .metrics_names import MetricDef


def build(defs: Iterable[MetricDef], registry: CollectorRegistry | None = None,
          extra_labels: tuple[str, ...] = ()) -> dict[str, Any]:
    """One prometheus object per definition, registered in `registry` (a fresh one by default).

    Counters are declared without their _total suffix: prometheus-client adds it."""
    registry = registry if registry is not None else CollectorRegistry()
    out: dict[str, Any] = {}
    for d in defs:
        labels = extra_labels + d.labels
        if d.kind == "gauge":
            out[d.name] = Gauge(d.name, d.help, labels, registry=registry)
        elif d.kind == "counter":
            out[d.name] = Counter(d.name.removesuffix("_total"), d.help, labels, registry=registry)
        elif d.kind == "histogram":
            out[d.name] = Histogram(d.name, d.help, labels, buckets=d.buckets, registry=registry)
        else:
            raise ValueError(f"unknown metric kind {d.kind}")
    out["_registry"] = registry
    return out
