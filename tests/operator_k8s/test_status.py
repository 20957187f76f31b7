"""The lifecycle as pure functions: pods + trainer report + time -> phase, conditions, actions."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from grpojob.api import FieldError, TrainerStatus, parse
from grpojob_operator.children import Scale
from grpojob_operator.status import (Decision, Event, Observation, PodView, count_restarts, decide, initial_status,
                                     parse_status, transitions, with_children)

from .conftest import job_manifest

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
# What a running trainer's /status says (the controller asks whenever trainer pod 0 runs): a
# job is Running only on its word.
TRAINING = TrainerStatus(phase="running", step=3, total_steps=20)


def job(**spec):
    return parse(job_manifest("j", **spec))


def pods(role: str, n: int, *, ready: bool = True, restarts: tuple = (), phase: str = "Running",
         uid: str = "") -> list[PodView]:
    name = "j-trainer" if role == "trainer" else "j-rollout"
    return [PodView(name=f"{name}-{i}", uid=f"{uid or role}-{i}", role=role, phase=phase, ready=ready,
                    restarts=restarts[i] if i < len(restarts) else 0) for i in range(n)]


def step(j, prev, now=T0, trainer=None, tp=None, rp=None, ledger=None, created=True, error="", **kw) -> Decision:
    """One reconcile as the controller does it: decide, then the children are in place. `error`:
    why the trainer's /status could not be read."""
    obs = Observation(now=now, trainer_pods=tp if tp is not None else [], rollout_pods=rp if rp is not None else [],
                      trainer=trainer, trainer_error=error, ledger=ledger if ledger is not None else {})
    d = decide(j, prev, obs, generation=1, **kw)
    return with_children(d, True, "ok", now) if (created and d.ensure_children) else d


def cond(st, type_):
    return next(c for c in st.conditions if c.type == type_)


def running_status(j):
    """A job that is Running with all pods ready."""
    d = step(j, initial_status(T0))
    d = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
             trainer=TrainerStatus(phase="running", step=3, total_steps=20))
    assert d.status.phase == "Running"
    return d


def test_pending_initializing_running_with_progress():
    j = job()
    d = step(j, initial_status(T0), created=False)
    assert d.status.phase == "Pending" and d.scale == Scale(2, 2) and d.ensure_children
    d = with_children(d, True, "5 child objects in place", T0)
    assert d.status.phase == "Initializing" and cond(d.status, "Created").status == "True"

    d = step(j, d.status, tp=pods("trainer", 2, ready=False), rp=pods("rollout", 2, ready=False))
    assert d.status.phase == "Initializing" and d.status.start_time == "2026-01-01T00:00:00Z"
    assert "trainer 0/2, rollout 0/2 ready" in d.status.message

    t = TrainerStatus(phase="running", step=5, total_steps=20, policy_version=5, reward_mean=0.5, kl=0.1,
                      tokens_per_second=99.0, last_checkpoint_step=4, weights_in_sync=False)
    d2 = step(j, d.status, now=T0 + timedelta(seconds=5), tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=t)
    st = d2.status
    assert st.phase == "Running" and st.message == "step 5/20"
    assert (st.progress.step, st.progress.reward_mean, st.progress.last_checkpoint_step) == (5, 0.5, 4)
    assert [cond(st, c).status for c in ("TrainerReady", "RolloutReady", "Running", "WeightsInSync")] == \
        ["True", "True", "True", "False"]
    assert st.trainer.ready == 2 and st.rollout.desired == 2
    assert st.start_time == "2026-01-01T00:00:00Z"  # kept from the first look at a running pod
    ev = transitions(d.status, st)
    assert Event("Normal", "AllReady", "TrainerReady=True: 2/2 trainer pods ready") in ev
    assert any(e.reason == "Running" for e in ev)
    # Unreachable trainer: progress is kept, not zeroed; nothing else changes on a quiet look.
    d3 = step(j, st, tp=pods("trainer", 2), rp=pods("rollout", 2), error="GET /status: timeout")
    assert d3.status.progress.step == 5
    d4 = step(j, d3.status, tp=pods("trainer", 2), rp=pods("rollout", 2), error="GET /status: timeout")
    assert transitions(d3.status, d4.status) == []


def test_running_needs_every_trainer_but_one_rollout_is_enough():
    j = job()
    d = running_status(j)
    one_rollout = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 1), trainer=TRAINING)
    assert one_rollout.status.phase == "Running" and cond(one_rollout.status, "RolloutReady").status == "False"
    assert Event("Warning", "Waiting", "RolloutReady=False: 1/2 rollout pods ready") in \
        transitions(d.status, one_rollout.status)
    one_trainer = step(j, d.status, tp=pods("trainer", 1), rp=pods("rollout", 2), trainer=TRAINING)
    assert one_trainer.status.phase == "Initializing"
    assert one_trainer.status.message == "waiting for pods: trainer 1/2, rollout 2/2 ready"


def test_restarts_count_incidents_not_pods_and_survive_pod_replacement():
    assert count_restarts({}, pods("trainer", 2, restarts=(1, 1))) == (1, {"trainer-0": 1, "trainer-1": 1})
    assert count_restarts({"trainer-0": 1}, pods("trainer", 1, restarts=(3,))) == (2, {"trainer-0": 3})
    # A pod replaced after it failed: its failure was counted; the new pod starts from zero.
    failed = [PodView("j-trainer-0", "old", "trainer", phase="Failed")]
    assert count_restarts({}, failed) == (1, {"old": 1})
    assert count_restarts({"old": 1}, pods("trainer", 1, uid="new")) == (0, {"new-0": 0})


def test_backoff_limit_fails_the_job_with_the_reason_and_cleans_up():
    j = job(runPolicy={"backoffLimit": 1})
    d = running_status(j)
    tp = pods("trainer", 2, restarts=(1,))
    d1 = step(j, d.status, tp=tp, rp=pods("rollout", 2), ledger=d.ledger, trainer=TRAINING)
    assert d1.status.restarts == 1 and d1.status.phase == "Running"
    crashed = [PodView("j-trainer-0", "trainer-0", "trainer", phase="Running", restarts=2,
                       message="trainer exited 1 (Error): OOM")] + pods("trainer", 2)[1:]
    d2 = step(j, d1.status, now=T0 + timedelta(minutes=1), tp=crashed, rp=pods("rollout", 2), ledger=d1.ledger)
    st = d2.status
    assert st.phase == "Failed" and st.restarts == 2 and st.completion_time == "2026-01-01T00:01:00Z"
    failed = cond(st, "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    assert failed.message == "trainer failed 2 times (backoffLimit 1): j-trainer-0: trainer exited 1 (Error): OOM"
    assert d2.scale == Scale(0, 0) and cond(st, "Running").status == "False"
    assert Event("Warning", "BackoffLimitExceeded", f"Failed=True: {failed.message}") in transitions(d1.status, st)
    # Terminal: more restarts change nothing.
    d3 = step(j, st, tp=pods("trainer", 2, restarts=(9,)), ledger=d2.ledger)
    assert d3.status.phase == "Failed" and d3.status.restarts == 2


def test_active_deadline_fails_the_job():
    j = job(runPolicy={"activeDeadlineSeconds": 60})
    d = running_status(j)
    assert step(j, d.status, now=T0 + timedelta(seconds=59), tp=pods("trainer", 2), rp=pods("rollout", 2),
                trainer=TRAINING).status.phase == "Running"
    late = step(j, d.status, now=T0 + timedelta(seconds=61), tp=pods("trainer", 2), rp=pods("rollout", 2))
    assert late.status.phase == "Failed" and cond(late.status, "Failed").reason == "DeadlineExceeded"


def test_suspend_asks_for_a_checkpoint_then_scales_to_zero_and_resume_comes_back():
    j = job(runPolicy={"suspend": True})
    d = running_status(job())
    ask = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=TrainerStatus(phase="running"),
               ledger=d.ledger)
    assert ask.request_suspend and ask.scale == Scale(2, 2)
    assert (cond(ask.status, "Suspended").status, cond(ask.status, "Suspended").reason) == ("Unknown", "Checkpointing")
    # Still checkpointing: wait, do not ask again; the trainer's exit-0 restart is not a failure.
    wait = step(j, ask.status, now=T0 + timedelta(seconds=2), tp=pods("trainer", 2, restarts=(1,)),
                rp=pods("rollout", 2), trainer=TrainerStatus(phase="checkpointing"), ledger=ask.ledger)
    assert not wait.request_suspend and wait.scale == Scale(2, 2) and wait.status.restarts == 0
    done = step(j, wait.status, now=T0 + timedelta(seconds=3), tp=pods("trainer", 2), rp=pods("rollout", 2),
                trainer=TrainerStatus(phase="suspended", step=7, last_checkpoint_step=7), ledger=wait.ledger)
    assert done.status.phase == "Suspended" and done.scale == Scale(0, 0)
    assert cond(done.status, "Suspended").reason == "Checkpointed"
    assert cond(done.status, "Suspended").message == "trainer checkpointed at step 7"
    assert cond(done.status, "TrainerReady").reason == "ScaledDown"
    assert all(e.type == "Normal" for e in transitions(wait.status, done.status))
    stay = step(j, done.status, now=T0 + timedelta(hours=1))
    assert stay.status.phase == "Suspended" and stay.scale == Scale(0, 0)

    resumed = step(job(), stay.status, now=T0 + timedelta(hours=2))
    assert resumed.scale == Scale(2, 2) and resumed.status.phase == "Initializing"
    assert cond(resumed.status, "Suspended").reason == "Resumed" and resumed.status.start_time is None


def test_suspend_without_a_running_trainer_or_past_the_timeout():
    j = job(runPolicy={"suspend": True})
    fresh = step(j, initial_status(T0))
    assert fresh.status.phase == "Suspended" and fresh.scale == Scale(0, 0) and not fresh.request_suspend
    d = running_status(job())
    ask = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=TrainerStatus(phase="running"))
    stuck = step(j, ask.status, now=T0 + timedelta(seconds=11), tp=pods("trainer", 2), rp=pods("rollout", 2),
                 trainer=TrainerStatus(phase="checkpointing"), suspend_timeout=10)
    assert stuck.status.phase == "Suspended" and cond(stuck.status, "Suspended").reason == "CheckpointTimeout"


def test_success_cleanup_policy_and_ttl():
    for policy, scale in (("All", Scale(0, 0)), ("Running", Scale(0, 0)), ("None", Scale(2, 2))):
        j = job(runPolicy={"cleanPodPolicy": policy, "ttlSecondsAfterFinished": 30})
        d = running_status(j)
        done = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
                    trainer=TrainerStatus(phase="completed", step=20, total_steps=20))
        assert done.status.phase == "Succeeded" and done.scale == scale, policy
        assert cond(done.status, "Succeeded").message == "trained 20/20 steps"
        assert not step(j, done.status, now=T0 + timedelta(seconds=29)).delete_job
        assert step(j, done.status, now=T0 + timedelta(seconds=30)).delete_job


def test_a_clean_exit_of_trainer_pod_zero_is_success_only_at_the_last_step():
    j = job(runPolicy={"backoffLimit": 0})
    d = running_status(j)  # the trainer last reported step 3 of 20
    exited = [PodView("j-trainer-0", "trainer-0", "trainer", phase="Running", restarts=1, clean_exit=True,
                      message="trainer exited 0 (Completed)")] + pods("trainer", 2)[1:]
    early = step(j, d.status, tp=exited, rp=pods("rollout", 2), trainer=None, ledger=d.ledger)
    assert early.status.phase == "Initializing" and early.status.restarts == 0, "an exit 0 at step 3/20 is not success"
    last = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), ledger=d.ledger,
                trainer=TrainerStatus(phase="running", step=20, total_steps=20))
    done = step(j, last.status, tp=exited, rp=pods("rollout", 2), trainer=None, ledger=last.ledger)
    assert done.status.phase == "Succeeded" and done.status.restarts == 0
    assert done.status.message == "trained 20/20 steps"
    # Pod 1 exiting 0 alone is not completion, and not a failure either.
    other = pods("trainer", 1) + [PodView("j-trainer-1", "trainer-1", "trainer", phase="Running", restarts=1, ready=True,
                                          clean_exit=True)]
    d2 = step(j, d.status, tp=other, rp=pods("rollout", 2), ledger=d.ledger, trainer=TRAINING)
    assert d2.status.phase == "Running" and d2.status.restarts == 0


def test_invalid_spec_is_failed_until_fixed():
    errors = [FieldError("spec.training.promptsPerStep", "must be a multiple of 4")]
    bad = step(None, initial_status(T0), errors=errors)
    assert not bad.ensure_children and bad.status.phase == "Failed"
    c = cond(bad.status, "InvalidSpec")
    assert (c.status, c.reason, c.message) == ("True", "InvalidSpec", "spec.training.promptsPerStep: must be a multiple of 4")
    assert Event("Warning", "InvalidSpec", f"InvalidSpec=True: {c.message}") in transitions(initial_status(T0), bad.status)
    fixed = step(job(), bad.status)
    assert fixed.ensure_children and fixed.status.phase == "Initializing"
    assert cond(fixed.status, "InvalidSpec").status == "False" and cond(fixed.status, "Failed").status == "False"


def test_refused_edit_keeps_the_phase():
    d = running_status(job())
    r = step(job(), d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=TRAINING,
             rejected=["spec.trainer.replicas cannot change"])
    assert r.status.phase == "Running" and cond(r.status, "InvalidSpec").reason == "ImmutableFieldChanged"


def test_unreadable_status_starts_afresh_and_conditions_keep_their_transition_time():
    assert parse_status({"phase": "Exploded"}, T0).phase == "Pending"
    st = parse_status({"phase": "Running", "kopf": {"x": 1}}, T0)
    assert st.phase == "Running" and len(st.conditions) == 10
    d = running_status(job())
    t = cond(d.status, "TrainerReady").last_transition_time
    later = step(job(), d.status, now=T0 + timedelta(hours=1), tp=pods("trainer", 2), rp=pods("rollout", 2))
    assert cond(later.status, "TrainerReady").last_transition_time == t


def test_after_the_end_the_autoscale_status_says_the_job_finished_with_its_last_figures():
    from grpojob.api.status import PipelineStatus
    auto = {"replicas": 1, "autoscale": {"maxReplicas": 3, "scaleUp": {"steps": 1, "cooldownSeconds": 0}}}
    j = job(rollout=auto)
    d = running_status(j)
    for n_ in (17, 18, 19, 20):  # (step 17, the first one seen, is no step time to compare with: left out)
        at = TrainerStatus(phase="running", step=n_, total_steps=20, pipeline=PipelineStatus(
            step=n_, wait_seconds=9.24, step_seconds=10.0, rollout_idle_fraction=0.05))
        d = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=at)
    assert (d.status.autoscale.reason, d.status.autoscale.replicas) == ("ScaleUp", 3)
    # the trainer stops stepping (restarting, say): no longer "has not reported yet"
    pause = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 3), trainer=TrainerStatus(phase="starting"))
    assert pause.status.autoscale.reason == "NoSignal"
    assert pause.status.autoscale.message == ("no step reported now (the trainer says starting); "
                                              "the last counted was step 20")
    done = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 3),
                trainer=TrainerStatus(phase="completed", step=20, total_steps=20))
    a = done.status.autoscale
    assert done.status.phase == "Succeeded"
    assert (a.reason, a.replicas, a.last_step, a.wait_fraction, a.idle_fraction) == ("Finished", 3, 20, 0.924, 0.05)
    assert a.message == ("the job Succeeded; autoscaling ended at 3 rollout servers, last counted step 20, "
                         "trainer waited 92% of it for groups, servers idle 5%")
    # later looks keep it (the job stays finished)
    assert step(j, done.status, now=T0 + timedelta(seconds=60)).status.autoscale == a
    # a job that fails says so too
    j0 = job(rollout=auto, runPolicy={"activeDeadlineSeconds": 1})
    failed = step(j0, d.status, now=T0 + timedelta(seconds=5), tp=pods("trainer", 2), rp=pods("rollout", 3),
                  trainer=TRAINING)
    assert failed.status.phase == "Failed" and failed.status.autoscale.reason == "Finished"
    assert failed.status.autoscale.message.startswith("the job Failed; autoscaling ended at 3 rollout servers")


def test_a_scale_up_that_gave_nothing_is_undone_with_a_scale_up_no_gain_event():
    from grpojob.api.status import PipelineStatus, RolloutLag
    from grpojob_operator.status import autoscaling
    j = job(rollout={"replicas": 1, "autoscale": {"maxReplicas": 3, "scaleUp": {
        "steps": 1, "cooldownSeconds": 0, "maxChange": 1, "minGain": 0.1, "backoffSeconds": 120}}})

    def trainer(step, seconds, servers):
        return TrainerStatus(phase="running", step=step, total_steps=20, rollouts=[
            RolloutLag(replica=f"j-rollout-{i}") for i in range(servers)], pipeline=PipelineStatus(
                step=step, wait_seconds=0.8 * seconds, step_seconds=seconds))
    st, events = autoscaling.step(j, None, trainer(1, 5.0, 1), T0)  # the first step: no step time to compare
    assert (st.replicas, st.reason) == (1, "Measuring")
    for step_ in (2, 3, 4):  # a trial's 3 steps before
        st, events = autoscaling.step(j, st, trainer(step_, 2.0, 1), T0)
    assert (st.replicas, st.reason, st.trial_from, st.before_seconds) == (2, "ScaleUp", 1, 2.0)
    # its state lives in the status: each look starts from the last one's status (an operator restart too)
    for step_, seconds, servers in ((5, 2.0, 1), (6, 2.5, 2), (7, 2.6, 2), (8, 2.5, 2), (9, 2.7, 2)):
        st, events = autoscaling.step(j, st, trainer(step_, seconds, servers), T0 + timedelta(seconds=10 * step_))
    assert (st.replicas, st.reason, st.backoff_seconds, st.trial_from) == (1, "ScaleUpNoGain", 120.0, 0)
    (event,) = events
    assert (event.type, event.reason) == ("Warning", "ScaleUpNoGain")
    assert event.message.startswith("2 -> 1 rollout servers: 2 servers made a step 2.60 s against 2.00 s with 1 "
                                    "(-23% steps a second; scaleUp.minGain 10%): they slow each other down; "
                                    "no scale-up for 120 s")
    st, events = autoscaling.step(j, st, trainer(10, 2.0, 1), T0 + timedelta(seconds=100))
    assert (st.replicas, st.reason, events) == (1, "BackingOff", [])
    assert autoscaling.rollout_replicas(j, st) == 1


def test_a_scale_up_that_paid_says_so_once_in_a_scale_up_kept_event():
    from grpojob.api.status import PipelineStatus, RolloutLag
    from grpojob_operator.status import autoscaling
    j = job(rollout={"replicas": 1, "autoscale": {"maxReplicas": 2, "scaleUp": {
        "steps": 1, "cooldownSeconds": 0, "maxChange": 1, "minGain": 0.1}}})

    def trainer(step, seconds, servers, wait=0.8):
        return TrainerStatus(phase="running", step=step, total_steps=20, rollouts=[
            RolloutLag(replica=f"j-rollout-{i}") for i in range(servers)], pipeline=PipelineStatus(
                step=step, wait_seconds=wait * seconds, step_seconds=seconds))
    st = None
    for step_ in (1, 2, 3, 4):  # the start-up step, then a trial's 3 steps before
        st, events = autoscaling.step(j, st, trainer(step_, 3.0, 1), T0)
    assert (st.replicas, st.reason) == (2, "ScaleUp")
    seen = []
    for step_, seconds in ((5, 2.5), (6, 2.0), (7, 2.0), (8, 2.0), (9, 2.0)):  # 2 s on 2 servers: +50%
        st, events = autoscaling.step(j, st, trainer(step_, seconds, 2, wait=0.1), T0 + timedelta(seconds=step_))
        seen += events
    assert [(e.type, e.reason) for e in seen] == [("Normal", "ScaleUpKept")]
    assert seen[0].message == ("the 1 -> 2 scale-up paid: 2 servers made a step 2.00 s against 3.00 s with 1 (+50% "
                               "steps a second; scaleUp.minGain 10%): they stay")
    assert (st.replicas, st.trial_from) == (2, 0)
