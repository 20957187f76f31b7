"""The exporters tell the truth: a value that is not known has no sample (not 0, not NaN), every
metric in grpojob.metrics_names has code that sets it, and each exporter's rules hold
(trainer StatusBoard, operator metrics)."""
from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from grpojob import metrics_names as mn
from grpojob.api import GRPOJob, GRPOJobStatus
from grpojob.api.status import Progress, RolloutLag
from grpojob.prom import OptionalGauge
from grpojob.leader.server import StatusBoard
from grpojob_operator import children
from grpojob_operator.metrics import CHILD_KINDS, RECONCILE_RESULTS, OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
EXPORTER_SOURCES = [*(ROOT / "runtime" / "grpojob").rglob("*.py"),
                    *(ROOT / "operator" / "grpojob_operator").rglob("*.py")]


def parse(text: bytes | str) -> dict[tuple[str, tuple], float]:
    text = text.decode() if isinstance(text, bytes) else text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def names(text: bytes | str) -> set[str]:
    return {name for name, _ in parse(text)}


# ---- every metric has a setter ------------------------------------------------------------------

def string_literals(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_every_metric_has_code_that_sets_it():
    """A metric only named in metrics_names (as grpojob_rollout_servers was) is set by nothing:
    each one must be set through its step-record field (StatusBoard.observe) or be named by the
    code of an exporter. The live test (test_live.py) then checks each really gets a sample."""
    used: set[str] = set()
    for path in EXPORTER_SOURCES:
        if path.name != "metrics_names.py":
            used |= string_literals(path)
    unset = [d.name for d in mn.ALL if not d.record and d.name not in used]
    assert not unset, f"defined in metrics_names but set by no exporter: {unset}"
    assert all(d in mn.TRAINER and d.kind in ("gauge", "counter") and not d.labels for d in mn.ALL if d.record)


# ---- OptionalGauge ------------------------------------------------------------------------------

def test_an_unlabelled_gauge_has_no_sample_until_set_and_after_clear():
    reg = CollectorRegistry()
    g = OptionalGauge("x_seconds", "help", reg)
    assert "x_seconds" not in names(generate_latest(reg))
    g.set(0.0)
    assert parse(generate_latest(reg))[("x_seconds", ())] == 0.0  # a real 0 is a sample
    for unknown in (None, float("nan")):
        g.set(2.5)
        g.set(unknown)
        assert "x_seconds" not in names(generate_latest(reg)), unknown
    g.set(1)
    g.clear()
    assert g.value is None


# ---- the trainer leader --------------------------------------------------------------------------

RECORD = {"step": 1, "policy_version": 1, "reward_mean": 0.25, "reward_std": 0.1, "rewards": {"toy": 0.25},
          "rewards_std": {"toy": 0.1}, "advantage_mean": 0.0, "advantage_std": 0.9, "loss": 0.02, "kl": 0.01,
          "entropy": 5.0, "stage_seconds": {"generate": 0.1}, "step_seconds": 0.2, "published": True}


def test_trainer_numbers_before_the_first_step_are_absent_not_zero():
    board = StatusBoard(total_steps=10)
    s = parse(board.prometheus_text())
    assert s[("grpojob_trainer_total_steps", ())] == 10 and s[("grpojob_trainer_step", ())] == 0
    for name in ("grpojob_loss", "grpojob_kl", "grpojob_advantage_std", "grpojob_reward_mean",
                 "grpojob_rollout_servers", "grpojob_rollout_server_lag"):
        assert name not in names(board.prometheus_text()), name


def test_kl_not_computed_has_no_sample_and_no_value_outlives_its_step():
    board = StatusBoard(total_steps=10)
    board.observe(RECORD)
    s = parse(board.prometheus_text())
    assert s[("grpojob_kl", ())] == 0.01 and s[("grpojob_advantage_std", ())] == 0.9
    assert s[("grpojob_reward_mean", (("reward", "toy"),))] == 0.25
    board.observe({**RECORD, "step": 2, "kl": None, "entropy": None, "reward_mean": None})  # klBeta 0
    text = board.prometheus_text()
    s = parse(text)
    assert "grpojob_kl" not in names(text) and "grpojob_entropy" not in names(text)
    assert ("grpojob_reward_mean", (("reward", "total"),)) not in s
    assert s[("grpojob_reward_mean", (("reward", "toy"),))] == 0.25


def test_status_updates_move_step_and_version_gauges():
    board = StatusBoard(total_steps=10)
    board.update(step=7, policy_version=8)
    s = parse(board.prometheus_text())
    assert (s[("grpojob_trainer_step", ())], s[("grpojob_policy_version", ())]) == (7, 8)


def test_counters_from_the_step_record_add_up():
    board = StatusBoard()
    for n in (2, 0, 3):
        board.observe({"groups_resampled": n, "groups_stale": 1})
    s = parse(board.prometheus_text())
    assert s[("grpojob_resampled_groups_total", ())] == 5 and s[("grpojob_stale_groups_total", ())] == 3


def test_rollout_servers_follow_membership_at_each_scrape():
    board = StatusBoard()
    board.update(policy_version=5)
    members = [{"replica": "r-0", "version": 5}, {"replica": "r-1", "version": 3}]
    board.watch_rollouts(lambda: list(members))
    s = parse(board.prometheus_text())
    assert s[("grpojob_rollout_servers", ())] == 2
    assert s[("grpojob_rollout_server_lag", (("replica", "r-0"),))] == 0
    assert s[("grpojob_rollout_server_lag", (("replica", "r-1"),))] == 2
    members.pop(0)  # r-0 died and was dropped from the group: the next scrape shows it
    s = parse(board.prometheus_text())
    assert s[("grpojob_rollout_servers", ())] == 1
    assert ("grpojob_rollout_server_lag", (("replica", "r-0"),)) not in s

    def broken():
        raise RuntimeError("store closed")
    board.watch_rollouts(broken)
    assert {"grpojob_rollout_servers", "grpojob_rollout_server_lag"}.isdisjoint(names(board.prometheus_text()))


# ---- the operator -------------------------------------------------------------------------------

def test_operator_knows_total_steps_from_the_spec_before_the_trainer_reports():
    m = OperatorMetrics()
    lbl = (("job", "a"), ("namespace", "ml"))
    m.job("ml", "a", GRPOJobStatus(phase="Initializing"), {"training": {"steps": 50}})
    s = parse(m.exposition())
    assert s[("grpojob_job_total_steps", lbl)] == 50 and s[("grpojob_job_step", lbl)] == 0
    assert ("grpojob_job_reward_mean", lbl) not in s and ("grpojob_job_policy_lag", lbl) not in s
    m.job("ml", "b", GRPOJobStatus(), {"model": {"path": "/m"}})  # steps left out: the spec's default
    assert parse(m.exposition())[("grpojob_job_total_steps", (("job", "b"), ("namespace", "ml")))] == 100

    m.job("ml", "a", GRPOJobStatus(phase="Running", progress=Progress(
        step=3, total_steps=50, reward_mean=0.5, rollouts=[RolloutLag(replica="r-0", version=3, lag=0),
                                                           RolloutLag(replica="r-1", version=1, lag=2)])),
          {"training": {"steps": 50}})
    s = parse(m.exposition())
    assert s[("grpojob_job_reward_mean", lbl)] == 0.5 and s[("grpojob_job_policy_lag", lbl)] == 2
    m.job("ml", "a", GRPOJobStatus(progress=Progress(step=3, weights_in_sync=True)), {"training": {"steps": 50}})
    s = parse(m.exposition())
    assert s[("grpojob_job_policy_lag", lbl)] == 0 and ("grpojob_job_reward_mean", lbl) not in s


def test_operator_counters_start_at_zero_for_every_label_value():
    s = parse(OperatorMetrics().exposition())
    for result in RECONCILE_RESULTS:
        assert s[("grpojob_operator_reconciles_total", (("result", result),))] == 0
    for kind in CHILD_KINDS:
        assert s[("grpojob_operator_child_errors_total", (("kind", kind),))] == 0


def test_child_kinds_are_the_kinds_the_operator_creates():
    job = GRPOJob.model_validate({
        "apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "k", "namespace": "ml"},
        "spec": {"model": {"path": "/m"}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}],
                 "scheduling": {"gang": "volcano"}, "monitoring": {"podMonitor": True}}})
    assert {o["kind"] for o in children.build(job, namespace="ml")} == set(CHILD_KINDS)
