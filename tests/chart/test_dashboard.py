"""The Grafana dashboard: a well-formed dashboard model, and every query uses only metrics and labels
that grpojob really exports (checked against the metric tables and the exposition of real
prometheus-client registries built from them), filtered by the namespace and job variables."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from grpojob import metrics_names as mn
from grpojob.prom import build

from .conftest import CHART
from .promql import parse, parse_label_values, result_labels

DASHBOARD = CHART / "dashboards" / "grpojob.json"

# Labels a series gets from its scrape target besides its own: the PodMonitor (trainer/rollout pods;
# `job` is the GRPOJob via jobLabel, `component` by relabeling) and the ServiceMonitor (operator).
POD_TARGET_LABELS = {"namespace", "pod", "job", "instance", "container", "endpoint", "component"}
OPERATOR_TARGET_LABELS = {"namespace", "pod", "job", "instance", "container", "endpoint", "service"}
# The job filter: `job` is the GRPOJob's name (chart PodMonitor's jobLabel, the operator's gauges) or
# "<namespace>/<name>" (a job's own PodMonitor, named after the job, without a jobLabel).
JOB_FILTER = ("=~", "(.+/)?$job")
GRAFANA_GLOBALS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    assert not dupes, f"duplicate JSON keys {dupes} (Grafana would keep only the last)"
    return dict(pairs)


@pytest.fixture(scope="module")
def dash() -> dict:
    return json.loads(DASHBOARD.read_text(), object_pairs_hook=_no_duplicate_keys)


def queries(dash: dict) -> list[tuple[str, dict, dict]]:
    """(expr, target, panel) for every panel query."""
    return [(t["expr"], t, p) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def series_owner() -> dict[str, mn.MetricDef]:
    """Series name (histograms expanded) -> its MetricDef."""
    out = {}
    for m in mn.ALL:
        out[m.name] = m
        if m.kind == "histogram":
            out.update({m.name + s: m for s in ("_bucket", "_sum", "_count")})
    return out


def labels_of(series: str) -> set[str]:
    m = series_owner()[series]
    target = OPERATOR_TARGET_LABELS if m in mn.OPERATOR else POD_TARGET_LABELS
    return set(m.labels) | target | ({"le"} if series.endswith("_bucket") else set())


# --- the dashboard model -------------------------------------------------------------------------

_DS = {"type": "object", "required": ["type", "uid"], "additionalProperties": False,
       "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}}}
_GRID = {"type": "object", "required": ["h", "w", "x", "y"], "additionalProperties": False,
         "properties": {k: {"type": "integer", "minimum": 0} for k in ("h", "w", "x", "y")}}
# Grafana's dashboard JSON model (schemaVersion 39), the parts this dashboard uses.
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time", "annotations"],
    "properties": {
        "id": {"type": "null"},  # instance-local: a provisioned dashboard must not carry one
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{8,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "refresh": {"type": "string"},
        "time": {"type": "object", "required": ["from", "to"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array", "items": {
            "type": "object", "required": ["name", "type"],
            "properties": {"name": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                           "type": {"enum": ["datasource", "query", "interval", "custom", "constant"]}}}}}},
        "panels": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "object", "required": ["id", "type", "title", "gridPos"], "properties": {
                "type": {"const": "row"}, "id": {"type": "integer"}, "gridPos": _GRID,
                "collapsed": {"const": False}, "panels": {"maxItems": 0}}},
            {"type": "object", "required": ["id", "type", "title", "gridPos", "datasource", "targets", "fieldConfig"],
             "properties": {
                 "type": {"enum": ["timeseries", "stat", "bargauge", "gauge", "table"]},
                 "id": {"type": "integer"}, "gridPos": _GRID, "datasource": _DS,
                 "title": {"type": "string", "minLength": 1}, "description": {"type": "string", "minLength": 1},
                 "targets": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "required": ["refId", "expr", "datasource"],
                     "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "legendFormat": {"type": "string"}, "datasource": _DS}}},
                 "fieldConfig": {"type": "object", "required": ["defaults", "overrides"], "properties": {
                     "defaults": {"type": "object", "properties": {
                         "unit": {"enum": ["short", "s", "percentunit", "reqps", "ops", "bytes", "none"]}}}}}}},
        ]}},
    },
}


def test_dashboard_is_a_grafana_dashboard(dash):
    jsonschema.validate(dash, DASHBOARD_SCHEMA)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), f"{p['title']}: duplicate refIds"


def test_panels_tile_the_24_column_grid(dash):
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            assert (g["w"], g["h"], g["x"]) == (24, 1, 0), p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    # Rows come in grid order, so Grafana shows each panel under its row.
    ys = [(p["gridPos"]["y"], p["gridPos"]["x"]) for p in dash["panels"]]
    assert ys == sorted(ys)


def test_every_variable_used_is_defined(dash):
    defined = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= defined
    texts = [e for e, _, _ in queries(dash)] + [json.dumps(v.get("query")) for v in dash["templating"]["list"]]
    texts += [json.dumps(p.get("datasource")) for p in dash["panels"]]
    for text in texts:
        for name in re.findall(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)", text):
            assert name in defined | GRAFANA_GLOBALS, f"${name} is not a dashboard variable: {text}"
    by_name = {v["name"]: v for v in dash["templating"]["list"]}
    assert by_name["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job"):  # multi-select with an All that matches everything
        v = by_name[name]
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        _, label = parse_label_values(v["query"]["query"])
        assert label == name


# --- metric names --------------------------------------------------------------------------------

def exposed_series() -> set[str]:
    """Sample names the real exporters' registries expose (built from the metric tables by
    grpojob.prom.build, as the trainer, rollout servers and operator do)."""
    names: set[str] = set()
    for table in (mn.TRAINER, mn.TRAINER_JUDGES, mn.ROLLOUT, mn.JUDGE, mn.OPERATOR):
        metrics = build(table)
        for d in table:
            m = metrics[d.name]
            child = m.labels(*["x"] * len(d.labels)) if d.labels else m  # labelled metrics show once used
            child.observe(1.0) if d.kind == "histogram" else child.inc() if d.kind == "counter" else child.set(1)
        for family in text_string_to_metric_families(generate_latest(metrics["_registry"]).decode()):
            names.update(s.name for s in family.samples)
    return names


def all_queries(dash):
    """(where, parsed query) for panel expressions and variable queries."""
    out = [(f"{p['title']}/{t['refId']}", parse(e)) for e, t, p in queries(dash)]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            out.append((f"${v['name']}", parse_label_values(v["query"]["query"])[0]))
    return out


def test_every_metric_name_is_exported(dash):
    exposed = exposed_series()
    assert mn.series_names() <= exposed | {m.name for m in mn.ALL}  # the table and the exporters agree
    used = set()
    for where, q in all_queries(dash):
        assert q.metric_names, f"{where}: no metric in the query"
        for name in q.metric_names:
            assert name in mn.series_names(), f"{where}: {name} is not in grpojob.metrics_names"
            assert name in exposed, f"{where}: {name} is not in any exporter's /metrics"
        used |= q.metric_names
    # What the issue asks the dashboard to show.
    wanted = {"grpojob_reward_mean", "grpojob_reward_std", "grpojob_kl", "grpojob_entropy", "grpojob_loss",
              "grpojob_clip_fraction", "grpojob_tokens_per_second", "grpojob_stage_seconds_sum",
              "grpojob_weight_sync_seconds_bucket", "grpojob_job_policy_lag", "grpojob_rollout_queue_depth",
              "grpojob_rollout_generated_tokens_total", "grpojob_job_trainer_ready", "grpojob_job_rollout_ready",
              "grpojob_operator_jobs"}
    assert wanted <= used, f"missing from the dashboard: {wanted - used}"


# Exported but deliberately not drawn, and why. Everything else in metrics_names is on the dashboard.
NOT_DRAWN = {
    "grpojob_trainer_total_steps": "Progress divides the operator's grpojob_job_step by grpojob_job_total_steps, "
                                   "known from the spec before the trainer runs",
    "grpojob_job_reward_mean": "the reward panels draw the trainer's per-step grpojob_reward_mean; the operator's "
                               "copy is for alerts over all jobs",
}


def test_every_exported_metric_is_drawn(dash):
    owner = series_owner()
    drawn = {owner[name].name for _, q in all_queries(dash) for name in q.metric_names}
    missing = {m.name for m in mn.ALL} - drawn - NOT_DRAWN.keys()
    assert not missing, f"exported but on no panel (draw them or say why in NOT_DRAWN): {sorted(missing)}"
    assert not drawn & NOT_DRAWN.keys(), "NOT_DRAWN lists a metric the dashboard draws"
    pipeline = {"grpojob_policy_staleness", "grpojob_policy_staleness_max", "grpojob_trainer_wait_seconds",
                "grpojob_rollout_idle_fraction", "grpojob_groups_in_flight", "grpojob_resampled_groups_total",
                "grpojob_stale_groups_total", "grpojob_generation_paused_seconds", "grpojob_rollout_server_lag"}
    row = next(i for i, p in enumerate(dash["panels"]) if p["type"] == "row" and p["title"] == "Async pipeline")
    end = next((i for i, p in enumerate(dash["panels"]) if i > row and p["type"] == "row"), len(dash["panels"]))
    in_row = {n for p in dash["panels"][row + 1:end] for t in p["targets"] for n in parse(t["expr"]).metric_names}
    assert pipeline <= in_row, f"not in the Async pipeline row: {pipeline - in_row}"


def test_every_label_is_one_the_series_has(dash):
    for where, q in all_queries(dash):
        available = set().union(*(labels_of(n) for n in q.metric_names))
        for sel in q.selectors:
            for name in sel.names:
                unknown = set(sel.matchers) - labels_of(name)
                assert not unknown, f"{where}: {name} has no label {unknown}"
        for kw, labels in q.groupings:
            assert set(labels) <= available, f"{where}: {kw} ({', '.join(labels)}) names labels no series has"


def test_legends_use_labels_the_result_keeps(dash):
    for expr, target, panel in queries(dash):
        q = parse(expr)
        available = set().union(*(labels_of(n) for n in q.metric_names))
        keeps = result_labels(q, available)
        for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", target.get("legendFormat", "")):
            assert label in keeps, f"{panel['title']}/{target['refId']}: legend {{{{{label}}}}} is dropped by {expr}"


@pytest.mark.parametrize("selected, label, matches", [
    ("(qwen|tiny)", "qwen", True), ("(qwen|tiny)", "ml/qwen", True), ("qwen", "ml/qwen", True),
    ("qwen", "qwen-2", False), ("qwen", "ml/qwen-2", False), ("qwen", "xqwen", False), (".*", "ml/x", True),
])
def test_job_filter_matches_both_job_label_forms(selected, label, matches):
    """Prometheus anchors regex matchers; Grafana writes a multi-value variable as (a|b)."""
    assert bool(re.fullmatch(JOB_FILTER[1].replace("$job", selected), label)) is matches


def test_job_metrics_are_filtered_by_namespace_and_job(dash):
    """Everything about jobs follows the $namespace and $job variables; only operator-wide series
    (reconciles, jobs by phase, child errors) are unfiltered."""
    owner = series_owner()
    for where, q in all_queries(dash):
        for sel in q.selectors:
            defs = {owner[n] for n in sel.names}
            per_job = any(d not in mn.OPERATOR or "job" in d.labels for d in defs)
            if where.startswith("$"):
                continue  # the variables themselves: $job filters by $namespace only
            if per_job:
                assert sel.matchers.get("namespace") == ("=~", "$namespace"), f"{where}: no $namespace filter"
                assert sel.matchers.get("job") == JOB_FILTER, f"{where}: no $job filter"
            else:
                assert "job" not in sel.matchers, f"{where}: operator-wide series have no GRPOJob label"


# --- the PromQL reader itself --------------------------------------------------------------------

@pytest.mark.parametrize("expr, names, groupings, keeps", [
    ('histogram_quantile(0.9, sum by (le, job) (rate(a_bucket{x="1"}[5m])))', {"a_bucket"}, [("by", ("le", "job"))],
     {"job"}),
    ("a / on (job) group_left (reward) b", {"a", "b"}, [("on", ("job",)), ("group_left", ("reward",))],
     {"job", "pod"}),
    ('{__name__=~"a|b", namespace="x"}', {"a", "b"}, [], {"job", "pod"}),
    ('sum(rate(c{l="sum by (x) nope"}[1m] offset 1h)) by (job) > bool 0', {"c"}, [("by", ("job",))], {"job"}),
    ("sum(d)", {"d"}, [], set()),
    ("sum without (pod) (e)", {"e"}, [("without", ("pod",))], {"job"}),
])
def test_promql_reader(expr, names, groupings, keeps):
    q = parse(expr)
    assert q.metric_names == names
    assert q.groupings == groupings
    assert result_labels(q, {"job", "pod"}) == keeps


def test_promql_reader_refuses_what_it_cannot_read():
    with pytest.raises(ValueError):
        parse('{job="x"}')  # no metric name: the check could not tell what it selects
    with pytest.raises(ValueError):
        parse("a{b=1}")
