"""spec.rollout.autoscale: its validation, and the pure rule (grpojob.api.autoscale.decide) with
hand-computed cases."""
from __future__ import annotations

import pytest

from grpojob.api import check
from grpojob.api.autoscale import DOWN, HOLD, UP, AutoscaleSpec, ScaleRule, Signals, State, decide, want

SPEC = AutoscaleSpec(min_replicas=1, max_replicas=8, target_wait_fraction=0.2, target_idle_fraction=0.5,
                     scale_up=ScaleRule(steps=2, cooldown_seconds=60, max_change=4),
                     scale_down=ScaleRule(steps=3, cooldown_seconds=300, max_change=1))


def doc(**rollout):
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "a"},
            "spec": {"model": {"path": "/m"}, "dataset": {"path": "/d"}, "rewards": [{"name": "toy"}],
                     "rollout": rollout}}


def errors(d):
    job, errs = check(d, resolve_plugins=False)
    return {e.path: e.message for e in errs}


def test_defaults_and_a_valid_spec():
    job, errs = check(doc(replicas=2, autoscale={"maxReplicas": 4}), resolve_plugins=False)
    assert errs == []
    a = job.spec.rollout.autoscale
    assert (a.min_replicas, a.max_replicas, a.target_wait_fraction, a.target_idle_fraction) == (1, 4, 0.2, 0.5)
    assert (a.scale_up.steps, a.scale_up.cooldown_seconds, a.scale_up.max_change) == (2, 60, 2)
    assert (a.scale_down.steps, a.scale_down.cooldown_seconds, a.scale_down.max_change) == (5, 300, 1)
    assert job.dump()["spec"]["rollout"]["autoscale"]["scaleDown"] == {"steps": 5, "cooldownSeconds": 300,
                                                                       "maxChange": 1}


def test_a_job_without_autoscale_renders_as_before():
    job, _ = check(doc(replicas=2), resolve_plugins=False)
    assert "autoscale" not in job.dump()["spec"]["rollout"]


def test_min_above_max_is_named_at_its_path():
    assert errors(doc(autoscale={"minReplicas": 3, "maxReplicas": 2})) == {
        "spec.rollout.autoscale.minReplicas": "3 exceeds maxReplicas (2)"}


def test_replicas_must_start_within_the_bounds():
    assert errors(doc(replicas=5, autoscale={"minReplicas": 2, "maxReplicas": 4})) == {
        "spec.rollout.replicas": "5: the servers to start with must be within rollout.autoscale's "
                                 "minReplicas..maxReplicas (2..4)"}


def test_not_with_placement_colocated_nor_mode_service():
    d = doc(autoscale={"maxReplicas": 4})
    d["spec"]["placement"] = "colocated"
    assert "spec.rollout.autoscale" in errors(d)
    d = doc(autoscale={"maxReplicas": 4})
    d["spec"]["mode"] = "service"
    assert "mode service" in errors(d)["spec.rollout.autoscale"]


def test_not_with_a_kueue_gang():
    d = doc(autoscale={"maxReplicas": 4})
    d["spec"]["scheduling"] = {"gang": "kueue"}
    assert errors(d)["spec.rollout.autoscale"].startswith("scheduling.gang kueue puts the pod group's size")


@pytest.mark.parametrize("field,value", [("targetWaitFraction", 1.0), ("targetIdleFraction", 0.0),
                                         ("maxReplicas", 0), ("minReplicas", 0)])
def test_out_of_range_fields(field, value):
    assert f"spec.rollout.autoscale.{field}" in errors(doc(autoscale={"maxReplicas": 4, field: value}))


def test_the_crd_refuses_min_above_max_too():
    rules = AutoscaleSpec.model_json_schema()["x-kubernetes-validations"]
    assert rules[0]["rule"] == "(has(self.minReplicas) ? self.minReplicas : 1) <= self.maxReplicas"


# want(): one step's ask. Wait share w = W/T; servers r' = ceil(r * W * (1 - t) / (t * (T - W))).
@pytest.mark.parametrize("replicas,wait,step,idle,expected", [
    (1, 8.0, 10.0, 0.0, (UP, 5)),     # 1*8*0.8/(0.2*2) = 16, capped at r + maxChange 4 = 5
    (2, 3.0, 10.0, 0.0, (UP, 4)),     # 2*3*0.8/(0.2*7) = 3.43 -> 4
    (7, 8.0, 10.0, 0.0, (UP, 8)),     # capped at maxReplicas 8
    (1, 10.0, 10.0, 0.0, (UP, 5)),    # the whole step waiting: as many as allowed
    (2, 2.1, 10.0, 0.0, (UP, 3)),     # 2*2.1*0.8/(0.2*7.9) = 2.13 -> 3 (at least one more)
    (3, 1.0, 10.0, 0.3, (HOLD, 3)),   # wait 0.1 <= 0.2, idle 0.3 <= 0.5: in the band
    (4, 0.0, 10.0, 0.9, (DOWN, 3)),   # busy ceil(4*0.1/0.5) = 1, but maxChange 1: 3
    (2, 1.5, 10.0, 0.8, (HOLD, 2)),   # busy 1, but 2*1.5*0.8/(0.2*8.5) = 1.41 -> 2 keep the wait under 0.2
    (1, 0.0, 10.0, 0.9, (HOLD, 1)),   # at minReplicas
])
def test_want(replicas, wait, step, idle, expected):
    assert want(SPEC, replicas, Signals(step=1, wait_seconds=wait, step_seconds=step, idle_fraction=idle)) == expected


def test_down_never_below_what_keeps_the_wait_under_target():
    spec = SPEC.model_copy(update={"scale_down": ScaleRule(steps=1, cooldown_seconds=0, max_change=3)})
    # r=4, W=1 of T=10 (0.1): busy ceil(4*0.1/0.5) = 1, wait bound 4*1*0.8/(0.2*9) = 1.78 -> 2
    assert want(spec, 4, Signals(step=1, wait_seconds=1.0, step_seconds=10.0, idle_fraction=0.9)) == (DOWN, 2)


def sig(step, wait, idle=0.0, total=10.0):
    return Signals(step=step, wait_seconds=wait, step_seconds=total, idle_fraction=idle)


def test_scale_up_needs_its_steps_takes_the_smallest_ask_then_cools_down():
    st = State(replicas=1)
    d = decide(SPEC, st, sig(1, 8.0), now=1000.0)
    assert (d.replicas, d.reason, d.state.streak, d.state.proposal) == (1, "Waiting", 1, 5)
    d = decide(SPEC, d.state, sig(1, 8.0), now=1010.0)  # the same step again: counts nothing
    assert (d.reason, d.state.streak) == ("NoNewStep", 1)
    d = decide(SPEC, d.state, sig(2, 5.0), now=1020.0)  # 1*5*0.8/(0.2*5) = 4 < 5: the smaller ask
    assert (d.replicas, d.reason, d.changed) == (4, "ScaleUp", True)
    assert d.message.startswith("1 -> 4 rollout servers: the trainer waits for groups over 20% of its step for 2 steps")
    assert d.state == State(replicas=4, last_step=2, last_change=1020.0)
    # still waiting: two more steps ask, but within scaleUp.cooldownSeconds (60) of the change
    d = decide(SPEC, d.state, sig(3, 5.0), now=1030.0)
    d = decide(SPEC, d.state, sig(4, 5.0), now=1040.0)
    assert (d.replicas, d.reason) == (4, "CoolingDown") and "waits 40 s more" in d.message
    d = decide(SPEC, d.state, sig(5, 5.0), now=1081.0)  # 4*5*0.8/(0.2*5) = 16, capped at 4 + 4 = 8
    assert (d.replicas, d.reason) == (8, "ScaleUp")


def test_a_step_in_the_band_breaks_the_streak():
    d = decide(SPEC, State(replicas=2), sig(1, 5.0), now=0.0)
    d = decide(SPEC, d.state, sig(2, 1.0, idle=0.3), now=10.0)
    assert (d.reason, d.state.streak, d.state.direction) == ("InBand", 0, HOLD)
    d = decide(SPEC, d.state, sig(3, 5.0), now=20.0)
    assert (d.reason, d.state.streak) == ("Waiting", 1)


def test_scale_down_after_its_steps_and_its_cooldown():
    spec = SPEC.model_copy(update={"scale_down": ScaleRule(steps=3, cooldown_seconds=300, max_change=2)})
    st = State(replicas=6, last_change=0.0)
    d = decide(spec, st, sig(1, 0.0, idle=0.95), now=100.0)  # busy ceil(6*0.05/0.5) = 1; maxChange 2: 4
    d = decide(spec, d.state, sig(2, 0.0, idle=0.6), now=200.0)  # ceil(6*0.4/0.5) = 5: the larger ask wins
    assert (d.reason, d.state.proposal) == ("Waiting", 5)
    d = decide(spec, d.state, sig(3, 0.0, idle=0.9), now=250.0)
    assert (d.replicas, d.reason) == (6, "CoolingDown")
    d = decide(spec, d.state, sig(4, 0.0, idle=0.9), now=301.0)
    assert (d.replicas, d.reason) == (5, "ScaleDown")
    assert "rollout servers idle over 50% of the step" in d.message


def test_bounds_are_obeyed_at_once():
    d = decide(SPEC, State(replicas=10, streak=1, direction=UP, proposal=10), None, now=5.0)
    assert (d.replicas, d.reason, d.state.streak, d.state.last_change) == (8, "Bounds", 0, 5.0)


def test_no_signal_before_the_first_step():
    d = decide(SPEC, State(replicas=2), None, now=0.0)
    assert (d.replicas, d.reason, d.changed) == (2, "NoSignal", False)
    d = decide(SPEC, State(replicas=2), Signals(step=0), now=0.0)
    assert d.reason == "NoSignal"


def test_signals_in_words():
    s = Signals(step=7, wait_seconds=3.0, step_seconds=4.0, idle_fraction=0.1, groups_in_flight=2, policy_lag=1)
    assert s.wait_fraction == 0.75
    assert s.words() == ("step 7, trainer waited 75% of the step for groups (3.00/4.00 s), rollout servers idle 10%, "
                         "2 groups in flight, policy lag 1")


def test_a_trainer_resumed_from_an_earlier_step_still_counts():
    d = decide(SPEC, State(replicas=1, last_step=20, direction=UP, streak=1, proposal=3), sig(11, 8.0), now=0.0)
    assert (d.replicas, d.reason) == (3, "ScaleUp")  # 3 < the 5 asked: the streak's smallest ask


def test_at_max_replicas_a_wait_asks_for_nothing():
    spec = SPEC.model_copy(update={"max_replicas": 2})
    st = State(replicas=2, direction=UP, streak=1, proposal=2)
    d = decide(spec, st, sig(3, 8.0), now=0.0)
    assert (d.replicas, d.reason, d.changed, d.state.streak) == (2, "AtLimit", False, 0)
    assert d.message.endswith("the trainer waits over 20%, and 2 is maxReplicas")
