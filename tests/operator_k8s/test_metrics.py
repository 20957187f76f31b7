"""The operator's own metrics: names from grpojob.metrics_names, one series per job."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from grpojob.api import GRPOJobStatus
from grpojob.api.status import Progress, ReplicaStatus
from grpojob.metrics_names import OPERATOR, series_names
from grpojob_operator.metrics import OperatorMetrics


def samples(m: OperatorMetrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(m.exposition().decode()) for s in fam.samples}


def test_job_gauges_phases_and_forgetting():
    m = OperatorMetrics()
    st = GRPOJobStatus(phase="Running", progress=Progress(step=4, total_steps=10, reward_mean=0.25, weights_in_sync=False),
                       trainer=ReplicaStatus(desired=2, ready=2), rollout=ReplicaStatus(desired=3, ready=1), restarts=1)
    m.job("ml", "a", st)
    m.job("ml", "b", GRPOJobStatus(phase="Running"))
    m.job("ml", "b", GRPOJobStatus(phase="Succeeded"))
    m.reconciled("success", 0.02)
    m.child_error("StatefulSet")
    s = samples(m)
    lbl = (("job", "a"), ("namespace", "ml"))
    assert s[("grpojob_job_step", lbl)] == 4 and s[("grpojob_job_reward_mean", lbl)] == 0.25
    assert s[("grpojob_job_policy_lag", lbl)] == 1 and s[("grpojob_job_rollout_ready", lbl)] == 1
    assert s[("grpojob_job_restarts", lbl)] == 1 and s[("grpojob_job_total_steps", lbl)] == 10
    assert s[("grpojob_operator_jobs", (("phase", "Running"),))] == 1
    assert s[("grpojob_operator_jobs", (("phase", "Succeeded"),))] == 1
    assert s[("grpojob_operator_reconciles_total", (("result", "success"),))] == 1
    assert s[("grpojob_operator_child_errors_total", (("kind", "StatefulSet"),))] == 1
    assert s[("grpojob_operator_reconcile_seconds_count", ())] == 1
    assert {name for name, _ in s if not name.endswith("_created")} <= series_names()
    families = {f.name for f in text_string_to_metric_families(m.exposition().decode())}
    assert {d.name.removesuffix("_total") for d in OPERATOR} <= families

    m.forget("ml", "a")
    s = samples(m)
    assert not any(dict(lbls).get("job") == "a" for _, lbls in s)
    assert s[("grpojob_operator_jobs", (("phase", "Running"),))] == 0
