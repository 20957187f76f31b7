"""spec.rollout.autoscale: its validation, and the pure rule (grpojob.api.autoscale.decide) with
hand-computed cases."""
from __future__ import annotations

import pytest

from grpojob.api import check
from grpojob.api.autoscale import (DOWN, HOLD, TRIAL_STEPS, UP, AutoscaleSpec, ScaleRule, ScaleUpRule, Signals, State,
                                   decide, want)

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
    spec = SPEC.model_copy(update={"scale_up": SPEC.scale_up.model_copy(update={"min_gain": 0.0})})  # any gain
    st = State(replicas=1, last_step=0, seconds=10.0, measured=3)  # the steps before a trial: measured
    d = decide(spec, st, sig(1, 8.0), now=1000.0)
    assert (d.replicas, d.reason, d.state.streak, d.state.proposal) == (1, "Waiting", 1, 5)
    d = decide(spec, d.state, sig(1, 8.0), now=1010.0)  # the same step again: counts nothing
    assert (d.reason, d.state.streak) == ("NoNewStep", 1)
    d = decide(spec, d.state, sig(2, 5.0), now=1020.0)  # 1*5*0.8/(0.2*5) = 4 < 5: the smaller ask
    assert (d.replicas, d.reason, d.changed) == (4, "ScaleUp", True)
    assert d.message.startswith("1 -> 4 rollout servers: the trainer waits for groups over 20% of its step for 2 steps")
    assert d.state == State(replicas=4, last_step=2, last_change=1020.0, measured=-1, trial_from=1, before=10.0)
    # still waiting: no scale-up while the change is measured (step 3 left out, steps 4 to 6 measured:
    # 10 s a step as before, which minGain 0 lets pass), then two steps ask, within scaleUp.cooldownSeconds
    for step in (3, 4, 5):
        d = decide(spec, d.state, sig(step, 5.0), now=1020.0 + step)
        assert (d.replicas, d.reason) == (4, "Measuring")
    d = decide(spec, d.state, sig(6, 5.0), now=1026.0)
    assert (d.replicas, d.reason, d.state.trial_from) == (4, "Waiting", 0)
    d = decide(spec, d.state, sig(7, 5.0), now=1030.0)
    assert (d.replicas, d.reason) == (4, "CoolingDown") and "waits 50 s more" in d.message
    d = decide(spec, d.state, sig(8, 5.0), now=1081.0)  # 4*5*0.8/(0.2*5) = 16, capped at 4 + 4 = 8
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
    st = State(replicas=1, last_step=20, direction=UP, streak=1, proposal=3, seconds=10.0, measured=3)
    d = decide(SPEC, st, sig(11, 8.0), now=0.0)
    assert (d.replicas, d.reason) == (3, "ScaleUp")  # 3 < the 5 asked: the streak's smallest ask


def test_at_max_replicas_a_wait_asks_for_nothing():
    spec = SPEC.model_copy(update={"max_replicas": 2})
    st = State(replicas=2, direction=UP, streak=1, proposal=2)
    d = decide(spec, st, sig(3, 8.0), now=0.0)
    assert (d.replicas, d.reason, d.changed, d.state.streak) == (2, "AtLimit", False, 0)
    assert d.message.endswith("the trainer waits over 20%, and 2 is maxReplicas")


# A scale-up on trial: the step time before (a running mean over the last n steps) against the mean of
# the first n steps the whole new pool served (its first one left out); n = max(scaleUp.steps, 3).
TRIAL = SPEC.model_copy(update={"scale_up": ScaleUpRule(steps=2, cooldown_seconds=0, max_change=1, min_gain=0.1,
                                                        backoff_seconds=100)})


def srv(step, total, servers, wait_share=0.8, idle=0.0):
    return Signals(step=step, wait_seconds=wait_share * total, step_seconds=total, idle_fraction=idle, servers=servers)


def test_a_scale_up_that_does_not_raise_the_step_rate_is_undone_and_backs_off_doubling():
    d = decide(TRIAL, State(replicas=1), srv(1, 30.0, 1), now=0.0)  # the first step pays the start-up: left out
    assert (d.reason, d.state.seconds, d.state.measured) == ("Waiting", 0.0, 0)
    d = decide(TRIAL, d.state, srv(2, 10.0, 1, wait_share=0.1), now=5.0)
    assert (d.reason, d.state.seconds, d.state.measured) == ("InBand", 10.0, 1)
    d = decide(TRIAL, d.state, srv(3, 8.0, 1), now=10.0)  # mean (10 + 8) / 2 = 9
    assert (d.reason, d.state.seconds) == ("Waiting", 9.0)
    d = decide(TRIAL, d.state, srv(4, 9.0, 1), now=20.0)  # (10 + 8 + 9) / 3
    assert (d.replicas, d.reason) == (2, "ScaleUp")
    assert (d.state.trial_from, d.state.before, d.state.measured) == (1, 9.0, -1)
    d = decide(TRIAL, d.state, srv(5, 12.0, 1), now=30.0)  # the new server has not joined: not measured
    assert (d.replicas, d.reason, d.state.measured) == (2, "Measuring", -1)
    assert d.kept == ""
    assert d.message.endswith("no scale-up before the 1 -> 2 one is measured (0 of 3 steps)")
    d = decide(TRIAL, d.state, srv(6, 12.0, 2), now=40.0)  # the whole pool's first step: left out
    assert (d.reason, d.state.measured, d.state.seconds) == ("Measuring", 0, 0.0)
    d = decide(TRIAL, d.state, srv(7, 11.0, 2), now=50.0)
    assert (d.reason, d.state.measured, d.state.seconds) == ("Measuring", 1, 11.0)
    d = decide(TRIAL, d.state, srv(8, 9.0, 2), now=55.0)
    assert (d.reason, d.state.measured, d.state.seconds) == ("Measuring", 2, 10.0)
    d = decide(TRIAL, d.state, srv(9, 10.0, 2), now=60.0)  # (11 + 9 + 10) / 3 = 10 s against 9 s: -10%
    assert (d.replicas, d.reason, d.changed) == (1, "ScaleUpNoGain", True)
    assert d.message.startswith("2 -> 1 rollout servers: 2 servers made a step 10.00 s against 9.00 s with 1 "
                                "(-10% steps a second; scaleUp.minGain 10%): they slow each other down; "
                                "no scale-up for 100 s (step 9")
    assert d.state == State(replicas=1, last_step=9, last_change=60.0, measured=-1, backoff=100.0)
    # the trainer still waits, but the back-off holds: no streak either
    d = decide(TRIAL, d.state, srv(10, 10.0, 2), now=70.0)
    assert (d.replicas, d.reason, d.state.streak) == (1, "BackingOff", 0)
    assert d.message.endswith("no scale-up for 90 s more (the last one did not pay)")
    for step, now in ((11, 170.0), (12, 175.0), (13, 180.0)):
        d = decide(TRIAL, d.state, srv(step, 10.0, 1), now=now)
    assert (d.replicas, d.reason, d.state.before) == (2, "ScaleUp", 10.0)
    for step in (14, 15, 16, 17):
        d = decide(TRIAL, d.state, srv(step, 12.0, 2), now=180.0 + step)
    assert (d.replicas, d.reason, d.state.backoff, d.state.last_change) == (1, "ScaleUpNoGain", 200.0, 197.0)


def test_no_scale_up_before_a_step_time_to_compare_it_with():
    spec = TRIAL.model_copy(update={"scale_up": TRIAL.scale_up.model_copy(update={"steps": 1})})
    d = decide(spec, State(replicas=1), srv(1, 30.0, 1), now=0.0)
    assert (d.replicas, d.reason, d.state.streak) == (1, "Measuring", 1)
    assert d.message.endswith("scale up to 2 waits for a step time to compare it with (0 of 3 steps)")
    for step in (2, 3):
        d = decide(spec, d.state, srv(step, 10.0, 1), now=float(step))
        assert (d.replicas, d.reason) == (1, "Measuring")
    d = decide(spec, d.state, srv(4, 10.0, 1), now=4.0)
    assert (d.replicas, d.reason, d.state.before) == (2, "ScaleUp", 10.0)


def test_a_trial_measures_at_least_three_steps_on_each_side():
    # On 2 CPU cores a step took 0.36-0.61 s for the same work; with two steps each side, a second
    # server that gained nothing passed minGain 10% in 2 of 3 runs.
    assert TRIAL_STEPS == 3
    d = decide(TRIAL, State(replicas=1), srv(1, 30.0, 1), now=0.0)
    d = decide(TRIAL, d.state, srv(2, 12.0, 1), now=1.0)
    assert (d.reason, d.state.streak, d.state.measured) == ("Measuring", 2, 1)
    assert d.message.endswith("scale up to 2 waits for a step time to compare it with (1 of 3 steps)")
    d = decide(TRIAL, d.state, srv(3, 9.0, 1), now=2.0)
    assert (d.reason, d.state.measured) == ("Measuring", 2)
    d = decide(TRIAL, d.state, srv(4, 9.0, 1), now=3.0)
    assert (d.replicas, d.reason, d.state.before) == (2, "ScaleUp", 10.0)  # (12 + 9 + 9) / 3
    # after n steps each new one weighs 1/n: 10 + (13 - 10) / 3
    st = State(replicas=1, last_step=4, seconds=10.0, measured=3)
    assert decide(TRIAL, st, srv(5, 13.0, 1, wait_share=0.1), now=4.0).state.seconds == 11.0
    # scaleUp.steps over 3: that many
    five = TRIAL.model_copy(update={"scale_up": TRIAL.scale_up.model_copy(update={"steps": 5})})
    st = State(replicas=1, last_step=4, seconds=10.0, measured=3, direction=UP, streak=4, proposal=2)
    d = decide(five, st, srv(5, 10.0, 1), now=4.0)
    assert d.reason == "Measuring" and d.message.endswith("(4 of 5 steps)")


def test_a_scale_up_that_pays_stays_and_the_back_off_starts_over():
    st = State(replicas=1, last_step=1, seconds=10.0, measured=3, backoff=200.0, last_change=-150.0)
    d = decide(TRIAL, st, srv(2, 10.0, 1), now=100.0)
    d = decide(TRIAL, d.state, srv(3, 10.0, 1), now=110.0)
    assert (d.replicas, d.reason, d.state.before) == (2, "ScaleUp", 10.0)
    d = decide(TRIAL, d.state, srv(4, 9.0, None), now=120.0)  # servers not reported: every step after the first
    for step, total in ((5, 8.0), (6, 9.0), (7, 8.5)):
        d = decide(TRIAL, d.state, srv(step, total, None, wait_share=0.1), now=130.0 + step)
    assert (d.replicas, d.reason, d.state.trial_from, d.state.backoff) == (2, "InBand", 0, 0.0)  # 10/8.5 - 1: +18%
    assert d.state.seconds == 8.5
    assert d.kept == ("the 1 -> 2 scale-up paid: 2 servers made a step 8.50 s against 10.00 s with 1 (+18% steps a "
                      "second; scaleUp.minGain 10%): they stay")
    assert decide(TRIAL, d.state, srv(8, 8.5, None, wait_share=0.1), now=140.0).kept == ""  # said once


def test_a_gain_under_the_margin_is_none_and_a_margin_of_zero_keeps_any_gain():
    before = State(replicas=2, last_step=3, seconds=5.0, measured=2, trial_from=1, before=5.25)
    for margin, reason in ((0.1, "ScaleUpNoGain"), (0.0, "InBand")):
        spec = TRIAL.model_copy(update={"scale_up": TRIAL.scale_up.model_copy(update={"min_gain": margin})})
        d = decide(spec, before, srv(4, 5.0, 2, wait_share=0.1), now=0.0)  # 5.25/5 - 1 = +5%
        assert d.reason == reason, margin
    never = TRIAL.model_copy(update={"scale_up": TRIAL.scale_up.model_copy(update={"min_gain": -1.0})})
    d = decide(never, before, srv(4, 20.0, 2, wait_share=0.1), now=0.0)  # 5.25/10 - 1 = -48%: kept all the same
    assert (d.replicas, d.reason, d.state.trial_from) == (2, "InBand", 0)


def test_a_scale_down_is_not_held_by_a_trial():
    spec = TRIAL.model_copy(update={"scale_down": ScaleRule(steps=1, cooldown_seconds=0, max_change=1)})
    st = State(replicas=3, last_step=4, measured=-1, trial_from=1, before=10.0)
    d = decide(spec, st, srv(5, 4.0, 3, wait_share=0.0, idle=0.9), now=0.0)
    assert (d.replicas, d.reason, d.state.trial_from) == (2, "ScaleDown", 0)


def test_a_plain_scale_rule_still_sets_scale_up():
    a = AutoscaleSpec(max_replicas=2, scale_up=ScaleRule(steps=3))
    assert (a.scale_up.steps, a.scale_up.min_gain, a.scale_up.backoff_seconds) == (3, 0.1, 300)
