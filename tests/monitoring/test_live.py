"""Monitoring that tells the truth, on a live run: a real `grpojob run` and the real operator
(against the kmock API), scraped as they run.

- Every metric grpojob defines has a sample on the endpoint that exports it, or is named in
  tests/monitoring/expectations.py as not measured here (and then has none): a gauge nobody sets
  fails here. Needs no Prometheus.
- A real Prometheus (Debian's package), scraping every second through the chart's PodMonitor and
  ServiceMonitor relabelling, answers every query of the Grafana dashboard with series whose values
  are plausible for this run; steps increase between scrapes. Skipped, saying so, without the
  prometheus binary or helm.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpojob import metrics_names as mn
from tests.chart.promql import parse, parse_label_values
from tests.chart.test_dashboard import DASHBOARD

from .expectations import ABSENT, PANELS
from .scene import JOB, NAMESPACE, STEPS

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # timing-sensitive: CI runs it alone

EXPORTERS = {"trainer-0": mn.TRAINER + mn.TRAINER_JUDGES, "rollout-0": mn.ROLLOUT}  # the judges: no samples here


def samples(url: str) -> dict[str, list]:
    """Sample name -> samples of the exposition at `url`."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def sample_name(d: mn.MetricDef) -> str:
    return d.name + "_count" if d.kind == "histogram" else d.name


def test_every_metric_is_set_or_named_as_not_measured(scene):
    exported = {name: samples(url) for name, url in scene.endpoints.items()}
    exported["operator"] = samples(scene.operator_url)
    tables = {**EXPORTERS, "operator": mn.OPERATOR}
    problems = []
    for where, table in tables.items():
        for d in table:
            has = bool(exported[where].get(sample_name(d)))
            if d.name in ABSENT and has:
                problems.append(f"{where}: {d.name} now has samples: take it out of expectations "
                                f"({ABSENT[d.name]})")
            elif d.name not in ABSENT and not has:
                problems.append(f"{where}: nothing set {d.name} (its dashboard panel would show no data)")
    assert not problems, "\n".join(problems)

    # The three things issue 16 found wrong, checked on the live endpoints.
    trainer, operator = exported["trainer-0"], exported["operator"]
    assert [s.value for s in trainer["grpojob_rollout_servers"]] == [1.0]
    job = {"namespace": NAMESPACE, "job": JOB}
    per_job = {name: [s.value for s in operator[name] if s.labels == job]
               for name in ("grpojob_job_total_steps", "grpojob_job_reward_mean", "grpojob_job_step")}
    assert per_job["grpojob_job_total_steps"] == [STEPS]
    assert len(per_job["grpojob_job_reward_mean"]) == 1 and 0 <= per_job["grpojob_job_reward_mean"][0] <= 1
    assert per_job["grpojob_job_step"][0] >= 1


# ---- the dashboard against a real Prometheus --------------------------------------------------

def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def grafana_values(dash: dict) -> dict[str, str]:
    """The variables as Grafana fills them for this job. $__rate_interval is Grafana's
    max(4 x scrape interval, $__interval + scrape interval) for the 1 s scrape over a short range."""
    smoothing = next(v for v in dash["templating"]["list"] if v["name"] == "smoothing")["current"]["value"]
    return {"namespace": NAMESPACE, "job": JOB, "smoothing": smoothing, "__rate_interval": "4s"}


def fill(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?", lambda m: values[m.group(1)], expr)


def metric_of(series: str) -> str:
    """The MetricDef name of a series name (histogram series carry a suffix)."""
    if series in mn.BY_NAME:
        return series
    return re.sub(r"_(bucket|sum|count)$", "", series)


def wait_scraped(prom, timeout: float = 120) -> None:
    """Until Prometheus has seen the trainer take 3 steps, and the operator report a step."""
    sel = f'{{namespace="{NAMESPACE}", job="{JOB}"}}'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        trained = prom.query(f"changes(grpojob_trainer_step{sel}[5m])")
        reported = prom.query(f"grpojob_job_step{sel}")
        if trained and trained[0]["value"] >= 3 and reported and reported[0]["value"] >= 1:
            return
        time.sleep(0.5)
    targets = [(t["scrapeUrl"], t["health"], t["lastError"], t["labels"]) for t in prom.targets()]
    raise AssertionError(f"Prometheus did not see 3 steps of {sel} within {timeout}s; targets: {targets}")


@pytest.fixture(scope="module")
def scraped(prometheus):
    started = time.time()
    wait_scraped(prometheus)
    return prometheus, started


def test_prometheus_scrapes_exactly_the_monitored_endpoints(scraped, scene):
    """The chart's selectors keep the trainer leader's and the rollout server's http port and the
    operator's metrics port; every other container port is dropped; all three are scraped (a 1 s
    scrape may time out now and then on a loaded machine: most must succeed)."""
    prom, _ = scraped
    targets = prom.targets()
    for t in targets:
        ok = prom.query(f'avg_over_time(up{{instance="{t["labels"]["instance"]}", job="{t["labels"]["job"]}"}}[1m])')
        assert ok and ok[0]["value"] >= 0.8, (t["scrapeUrl"], ok, t["lastError"])
    got = {(t["labels"]["job"], t["labels"]["namespace"], t["labels"]["pod"], t["labels"]["endpoint"])
           for t in targets}
    pods = {(JOB, NAMESPACE, p["metadata"]["name"], "http") for p in scene.pods()}
    operator = got - pods
    assert pods <= got and len(operator) == 1, got
    job, namespace, pod, endpoint = operator.pop()
    assert (job, namespace, endpoint) == ("grpojob-metrics", "grpojob-system", "metrics")  # the chart's Service


def test_every_dashboard_query_returns_plausible_series(scraped):
    prom, _ = scraped
    dash = dashboard()
    values = grafana_values(dash)
    titles = [p["title"] for p in dash["panels"] if p["type"] != "row"]
    assert sorted(titles) == sorted(PANELS), "tests/monitoring/expectations.py PANELS must list every panel"

    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            _, label = parse_label_values(v["query"]["query"])
            selector = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", fill(v["query"]["query"], values),
                                    re.S).group(1)
            assert {"namespace": NAMESPACE, "job": JOB}[label] in prom.label_values(label, selector), v["name"]

    # A failed scrape marks its target's series stale until the next one: a panel empty for that
    # reason is asked again a scrape later; one that stays wrong fails.
    for _ in range(5):
        problems = panel_problems(prom, dash, values)
        if not problems:
            return
        time.sleep(1.5)
    raise AssertionError("\n".join(problems))


def panel_problems(prom, dash: dict, values: dict[str, str]) -> list[str]:
    problems = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            where = f"{panel['title']}/{target['refId']}"
            expr = fill(target["expr"], values)
            absent = {metric_of(n) for n in parse(target["expr"]).metric_names} & ABSENT.keys()
            result = prom.query(expr)
            if absent:
                if result:
                    problems.append(f"{where}: {sorted(absent)} returns data now; update expectations.py")
                continue
            got = [r["value"] for r in result]
            if not got:
                problems.append(f"{where}: no data for {expr}")
            elif any(math.isnan(v) for v in got):
                problems.append(f"{where}: NaN in {result}")
            else:
                problems += [f"{where}: {p}" for p in PANELS[panel["title"]].problems(got)]
    return problems


def test_steps_increase_while_scraped(scraped):
    prom, started = scraped
    for expr in (f'grpojob_trainer_step{{namespace="{NAMESPACE}", job="{JOB}"}}',
                 f'grpojob_job_step{{namespace="{NAMESPACE}", job="{JOB}"}}'):
        series = prom.query_range(expr, started, time.time(), 1.0)
        assert len(series) == 1, f"{expr}: {series}"
        steps = [v for _, v in series[0]["values"]]
        assert steps == sorted(steps) and steps[-1] > steps[0], f"{expr}: {steps}"
