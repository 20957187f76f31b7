"""Build prometheus-client metrics from the tables in metrics_names (imports prometheus_client).

A gauge exports a sample only once its value is known: prometheus-client's plain unlabelled Gauge
always exports one (0 before anything set it), which a dashboard shows as a real 0. So every
unlabelled gauge here is an OptionalGauge (no sample until set, none again after `clear()` or
`set(None)`), and labelled gauges, which prometheus-client exports only per label set used, drop a
label set with `remove()`. A panel then shows "no data" for what was not measured (grpojob_kl with
klBeta 0, a loss before the first step) instead of a made-up 0 or NaN.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Iterable, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from grpojob.metrics_names import MetricDef


class OptionalGauge(Collector):
    """An unlabelled gauge with no sample until it is set; `set(None)` (or NaN) and `clear()`
    take the sample away again."""

    def __init__(self, name: str, documentation: str, registry: Optional[CollectorRegistry]):
        self.name, self.documentation = name, documentation
        self._value: Optional[float] = None
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def set(self, value: Optional[float]) -> None:
        value = None if value is None else float(value)
        with self._lock:
            self._value = None if value is None or math.isnan(value) else value

    def clear(self) -> None:
        self.set(None)

    @property
    def value(self) -> Optional[float]:
        return self._value

    def describe(self) -> list[GaugeMetricFamily]:  # lets the registry refuse duplicate names
        return [GaugeMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation)
        value = self._value
        if value is not None:
            family.add_metric([], value)
        yield family


class Included(Collector):
    """Another registry's metrics, served by the registry this is registered in: one /metrics for
    both (the trainer leader's serves grpojob.rewards.judge_watch's)."""

    def __init__(self, source: CollectorRegistry):
        self.source = source

    def collect(self) -> Iterator[Any]:
        return self.source.collect()


def build(defs: Iterable[MetricDef], registry: CollectorRegistry | None = None,
          extra_labels: tuple[str, ...] = ()) -> dict[str, Any]:
    """One prometheus object per definition, registered in `registry` (a fresh one by default).

    Counters are declared without their _total suffix: prometheus-client adds it."""
    registry = registry if registry is not None else CollectorRegistry()
    out: dict[str, Any] = {}
    for d in defs:
        labels = extra_labels + d.labels
        if d.kind == "gauge":
            out[d.name] = (Gauge(d.name, d.help, labels, registry=registry) if labels
                           else OptionalGauge(d.name, d.help, registry))
        elif d.kind == "counter":
            out[d.name] = Counter(d.name.removesuffix("_total"), d.help, labels, registry=registry)
        elif d.kind == "histogram":
            out[d.name] = Histogram(d.name, d.help, labels, buckets=d.buckets, registry=registry)
        else:
            raise ValueError(f"unknown metric kind {d.kind}")
    out["_registry"] = registry
    return out
