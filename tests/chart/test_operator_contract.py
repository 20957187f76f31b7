"""The chart against the operator's own code: the runtime image and its env variable, and the
PodMonitor selecting the pods the operator really renders for a job (operator/grpojob_operator)."""
from __future__ import annotations

import re

import pytest
import yaml

from grpojob.api import check

from .conftest import ALL_ON, NAMESPACED, ROOT, by_kind, one
from .test_chart import check_monitor, operator_container, selects

children = pytest.importorskip("grpojob_operator.children", reason="operator/grpojob_operator is not in this tree")
names = pytest.importorskip("grpojob_operator.names", reason="operator/grpojob_operator is not in this tree")


@pytest.fixture(scope="module")
def job_children() -> list[dict]:
    doc = yaml.safe_load((ROOT / "examples" / "qwen-gsm8k.yaml").read_text())
    doc["spec"]["monitoring"] = {"podMonitor": True}
    job, errors = check(doc, resolve_plugins=False)
    assert not errors, errors
    return children.build(job, namespace="ml")


def pod_templates(objs: list[dict]) -> dict[str, dict]:
    """component -> pod template of the trainer StatefulSet and rollout Deployment."""
    out = {}
    for o in objs:
        if o["kind"] in ("StatefulSet", "Deployment"):
            t = o["spec"]["template"]
            out[t["metadata"]["labels"][names.LABEL_COMPONENT]] = t
    return out


def test_runtime_image_default_and_env_match_the_operator(render):
    env = {e["name"]: e.get("value") for e in operator_container(render())["env"]}
    assert env[names.IMAGE_ENV] == names.DEFAULT_IMAGE


@pytest.mark.parametrize("args", [ALL_ON, NAMESPACED + ALL_ON], ids=["cluster", "namespaced"])
def test_pod_monitor_selects_the_pods_the_operator_renders(render, job_children, args):
    objs = render(*args)
    pm = one(objs, "PodMonitor")
    templates = pod_templates(job_children)
    assert set(templates) == {"trainer", "rollout"}
    for component, t in templates.items():
        assert selects(pm["spec"]["selector"], t["metadata"]["labels"]), component
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in t["spec"]["containers"] for p in c.get("ports", [])}
        assert ep["port"] in ports, f"{component} pods have no port named {ep['port']}"
        # jobLabel reads the pod label holding the GRPOJob's name.
        assert t["metadata"]["labels"][pm["spec"]["jobLabel"]] == "qwen-gsm8k"
    ns = pm["spec"]["namespaceSelector"]
    assert ns.get("any") or "ml" in ns["matchNames"]
    # The chart's operator Service never selects job pods, and the job monitor never the operator.
    svc = one(objs, "Service")
    for t in templates.values():
        assert not selects({"matchLabels": svc["spec"]["selector"]}, t["metadata"]["labels"])


def test_trainer_rank_zero_filter_uses_the_statefulset_index_label(render):
    (ep,) = one(render(*ALL_ON), "PodMonitor")["spec"]["podMetricsEndpoints"]
    (drop,) = [r for r in ep["relabelings"] if r.get("action") == "drop"]
    meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", names.POD_INDEX_LABEL)
    assert meta in drop["sourceLabels"]


def test_the_operators_own_pod_monitor_is_well_formed(job_children):
    """A job's own PodMonitor (spec.monitoring.podMonitor) passes the same structure check."""
    monitors = by_kind(job_children, "PodMonitor")
    assert len(monitors) == 1
    check_monitor(monitors[0])


def test_with_jobs_metrics_auth_a_jobs_pod_monitor_presents_the_token_from_the_jobs_secret():
    """jobs.metricsAuth reaches the pods (GRPOJOB_METRICS_AUTH) and the job's own PodMonitor, whose
    bearer token is the key of the job's Secret that the pods mount."""
    from grpojob import auth

    doc = yaml.safe_load((ROOT / "examples" / "qwen-gsm8k.yaml").read_text())
    doc["spec"]["monitoring"] = {"podMonitor": True}
    job, _ = check(doc, resolve_plugins=False)
    objs = children.build(job, namespace="ml", cluster=children.Cluster(metrics_auth=True))
    (ep,) = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    secret = children.token_secret("qwen-gsm8k", "ml", None, "t")
    assert ep["authorization"] == {"type": "Bearer", "credentials": {"name": secret["metadata"]["name"],
                                                                     "key": auth.TOKEN_KEY}}
    assert auth.TOKEN_KEY in secret["data"]
    for t in pod_templates(objs).values():
        env = {e["name"]: e.get("value") for c in t["spec"]["containers"] for e in c["env"]}
        assert env[auth.ENV_METRICS_AUTH] == "true"
        assert {"name": children.TOKEN_VOLUME, "secret": {"secretName": secret["metadata"]["name"],
                                                          "defaultMode": 0o440}} in t["spec"]["volumes"]
    check_monitor(one(objs, "PodMonitor"))
    (plain,) = one(job_children_default(), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert "authorization" not in plain


def job_children_default() -> list[dict]:
    doc = yaml.safe_load((ROOT / "examples" / "qwen-gsm8k.yaml").read_text())
    doc["spec"]["monitoring"] = {"podMonitor": True}
    job, _ = check(doc, resolve_plugins=False)
    return children.build(job, namespace="ml")
