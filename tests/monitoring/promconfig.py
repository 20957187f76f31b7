"""Prometheus scrape configs for the chart's PodMonitor and ServiceMonitor, as the Prometheus Operator
writes them, with Kubernetes service discovery acted out by static targets.

The relabelling is not written here: it is read from the chart's rendered PodMonitor and
ServiceMonitor and translated the way the Prometheus Operator's config generator does
(prometheus-operator pkg/prometheus/promcfg.go: generatePodMonitorConfig and
generateServiceMonitorConfig): selector -> keep rules, port -> keep rule, namespace / container /
pod / service labels, `job` (jobLabel, or the monitor's default), `endpoint`, then the monitor's own
relabelings. Kubernetes service discovery (no cluster here) is acted out: each static target
carries the `__meta_kubernetes_*` labels the pod or endpoints role would give it, made from real
objects (the pods the operator's StatefulSet and Deployment produce, the chart's Service and
Deployment). So a selector that stops matching the pods, or a relabelling that loses a label the
dashboard filters on, empties the panels of the test that uses this.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

Obj = Mapping[str, Any]


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(rule: Obj) -> dict[str, Any]:
    """A monitoring.coreos.com RelabelConfig (camelCase) as Prometheus relabel_config."""
    keys = {"sourceLabels": "source_labels", "separator": "separator", "targetLabel": "target_label",
            "regex": "regex", "modulus": "modulus", "replacement": "replacement", "action": "action"}
    unknown = set(rule) - set(keys)
    if unknown:
        raise ValueError(f"relabeling field(s) {sorted(unknown)} not translated here: {rule}")
    return {keys[k]: v for k, v in rule.items()}


def _selector(selector: Obj, prefix: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for key in sorted(selector.get("matchLabels") or {}):
        rules.append({"action": "keep", "source_labels": [f"{prefix}label_{_sanitize(key)}",
                                                          f"{prefix}labelpresent_{_sanitize(key)}"],
                      "regex": f"({selector['matchLabels'][key]});true"})
    for exp in selector.get("matchExpressions") or []:
        key, op = _sanitize(exp["key"]), exp["operator"]
        if op in ("In", "NotIn"):
            rules.append({"action": "keep" if op == "In" else "drop",
                          "source_labels": [f"{prefix}label_{key}", f"{prefix}labelpresent_{key}"],
                          "regex": f"({'|'.join(exp['values'])});true"})
        elif op in ("Exists", "DoesNotExist"):
            rules.append({"action": "keep" if op == "Exists" else "drop",
                          "source_labels": [f"{prefix}labelpresent_{key}"], "regex": "true"})
        else:
            raise ValueError(f"selector operator {op}")
    return rules


# What the translation below covers; anything else in a monitor fails loudly instead of being ignored.
_ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "relabelings", "filterRunning"}
_SPEC_FIELDS = {"selector", "namespaceSelector", "jobLabel", "podTargetLabels", "podMetricsEndpoints", "endpoints"}


def _check(monitor: Obj, endpoints: str) -> None:
    spec = monitor["spec"]
    extra = set(spec) - _SPEC_FIELDS
    for ep in spec[endpoints]:
        extra |= set(ep) - _ENDPOINT_FIELDS
    if extra:
        raise ValueError(f"{monitor['kind']} {monitor['metadata']['name']}: {sorted(extra)} not translated here")


_RUNNING = {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def _scrape(job_name: str, ep: Obj, honor: bool, relabel: list[dict[str, Any]],
            targets: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"job_name": job_name, "honor_labels": honor, "metrics_path": ep.get("path", "/metrics"),
                           "static_configs": targets, "relabel_configs": relabel}
    for key, prom_key in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")):
        if ep.get(key):
            out[prom_key] = ep[key]
    return out


def pod_monitor(pm: Obj, pods: Iterable[Obj], address: Mapping[tuple[str, str], str]) -> list[dict[str, Any]]:
    """Scrape configs of a PodMonitor over `pods` (Pod objects). `address[(pod name, port name)]`
    is where that container port is reached from here (ports not in it point at the port number
    on 127.0.0.1, where nothing should be scraped if the rules drop them)."""
    _check(pm, "podMetricsEndpoints")
    ns, name, spec = pm["metadata"]["namespace"], pm["metadata"]["name"], pm["spec"]
    targets = [target for pod in pods for target in _pod_targets(pod, address)]
    out = []
    for i, ep in enumerate(spec["podMetricsEndpoints"]):
        rules = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        if ep.get("filterRunning", True):
            rules.append(_RUNNING)
        rules += _selector(spec.get("selector") or {}, "__meta_kubernetes_pod_")
        rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                      "regex": ep["port"]})
        rules += [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                  {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                  {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]
        for label in spec.get("podTargetLabels") or []:
            rules.append({"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"],
                          "target_label": _sanitize(label), "regex": "(.+)", "replacement": "${1}"})
        rules.append({"target_label": "job", "replacement": f"{ns}/{name}"})
        if spec.get("jobLabel"):
            rules.append({"source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(spec['jobLabel'])}"],
                          "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
        rules.append({"target_label": "endpoint", "replacement": ep["port"]})
        rules += [_relabel(r) for r in ep.get("relabelings") or []]
        out.append(_scrape(f"podMonitor/{ns}/{name}/{i}", ep, bool(ep.get("honorLabels")), rules, targets))
    return out


def _pod_meta(pod: Obj) -> dict[str, str]:
    meta = pod["metadata"]
    labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
              "__meta_kubernetes_pod_phase": (pod.get("status") or {}).get("phase", "Pending")}
    for key, value in (meta.get("labels") or {}).items():
        labels[f"__meta_kubernetes_pod_label_{_sanitize(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{_sanitize(key)}"] = "true"
    return labels


def _pod_targets(pod: Obj, address: Mapping[tuple[str, str], str]) -> list[dict[str, Any]]:
    """The pod role's targets: one per declared container port."""
    out = []
    for c in pod["spec"]["containers"]:
        for port in c.get("ports") or []:
            where = address.get((pod["metadata"]["name"], port.get("name", "")),
                                f"127.0.0.1:{port['containerPort']}")
            out.append({"targets": [where], "labels": {
                **_pod_meta(pod), "__meta_kubernetes_pod_container_name": c["name"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})
    return out


def service_monitor(sm: Obj, service: Obj, pod: Obj, address: Mapping[str, str]) -> list[dict[str, Any]]:
    """Scrape configs of a ServiceMonitor over one Service backed by one pod (the endpoints role);
    `address[port name]` is where the service port is reached from here."""
    _check(sm, "endpoints")
    if sm["spec"].get("podTargetLabels"):
        raise ValueError("ServiceMonitor podTargetLabels: not translated here")
    ns, name, spec = sm["metadata"]["namespace"], sm["metadata"]["name"], sm["spec"]
    meta = service["metadata"]
    base = {**_pod_meta(pod), "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_service_name": meta["name"],
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": pod["metadata"]["name"],
            "__meta_kubernetes_pod_container_name": pod["spec"]["containers"][0]["name"]}
    for key, value in (meta.get("labels") or {}).items():
        base[f"__meta_kubernetes_service_label_{_sanitize(key)}"] = value
        base[f"__meta_kubernetes_service_labelpresent_{_sanitize(key)}"] = "true"
    targets = [{"targets": [address.get(p["name"], f"127.0.0.1:{p['port']}")],
                "labels": {**base, "__meta_kubernetes_endpoint_port_name": p["name"]}}
               for p in service["spec"]["ports"]]
    out = []
    for i, ep in enumerate(spec["endpoints"]):
        rules = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        rules += _selector(spec.get("selector") or {}, "__meta_kubernetes_service_")
        rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                      "regex": ep["port"]})
        kind_name = ["__meta_kubernetes_endpoint_address_target_kind",
                     "__meta_kubernetes_endpoint_address_target_name"]
        rules += [{"source_labels": kind_name, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}",
                   "target_label": "node"},
                  {"source_labels": kind_name, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}",
                   "target_label": "pod"},
                  {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                  {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                  {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                  {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}]
        if ep.get("filterRunning", True):
            rules.append(_RUNNING)
        rules.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                      "replacement": "${1}"})
        if spec.get("jobLabel"):
            rules.append({"source_labels": [f"__meta_kubernetes_service_label_{_sanitize(spec['jobLabel'])}"],
                          "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
        rules.append({"target_label": "endpoint", "replacement": ep["port"]})
        rules += [_relabel(r) for r in ep.get("relabelings") or []]
        out.append(_scrape(f"serviceMonitor/{ns}/{name}/{i}", ep, bool(ep.get("honorLabels")), rules, targets))
    return out
