"""What the trainer's report (or its absence) does to a job, as pure functions: reachability,
progress (never backwards), suspending a trainer that does not answer, completion (from /status or
the termination message), rollout engine failures, condition times."""
from __future__ import annotations

from datetime import timedelta

from grpojob.api import TrainerStatus
from grpojob.api.status import CONDITION_TYPES, EvaluationStatus, RolloutLag
from grpojob_operator.children import Scale
from grpojob_operator.status import Event, PodView, initial_status, transitions, with_suspend_request

from .conftest import PER_POD
from .test_status import T0, TRAINING, cond, job, pods, running_status, step

UNREACHABLE = "GET http://t-trainer-0.t-trainer.ml.svc:9400/status: ClientConnectorError: connection refused"


def test_a_ready_trainer_that_does_not_answer_is_unreachable_with_the_error():
    j = job()
    d = running_status(j)
    assert cond(d.status, "TrainerReachable").status == "True"
    lost = step(j, d.status, now=T0 + timedelta(seconds=10), tp=pods("trainer", 2), rp=pods("rollout", 2),
                error=UNREACHABLE, ledger=d.ledger)
    c = cond(lost.status, "TrainerReachable")
    assert (c.status, c.reason, c.message) == ("False", "Unreachable", UNREACHABLE)
    assert c.last_transition_time == "2026-01-01T00:00:10Z"
    # Not Running while the trainer does not answer (issue 31): Initializing, saying so.
    assert lost.status.phase == "Initializing" and lost.status.message == f"the trainer does not answer: {UNREACHABLE}"
    assert (cond(lost.status, "Running").status, cond(lost.status, "Running").reason) == ("False", "TrainerUnreachable")
    assert Event("Warning", "Unreachable", f"TrainerReachable=False: {UNREACHABLE}") in transitions(d.status, lost.status)
    assert cond(lost.status, "WeightsInSync").status == "Unknown"
    # Still failing a look later: no new Event; a different error is news.
    again = step(j, lost.status, now=T0 + timedelta(seconds=20), tp=pods("trainer", 2), rp=pods("rollout", 2),
                 error=UNREACHABLE, ledger=lost.ledger)
    assert transitions(lost.status, again.status) == []
    assert cond(again.status, "TrainerReachable").last_transition_time == "2026-01-01T00:00:10Z"
    other = step(j, again.status, tp=pods("trainer", 2), rp=pods("rollout", 2), error="GET /status: HTTP 500",
                 ledger=again.ledger)
    assert [e.reason for e in transitions(again.status, other.status)] == ["Unreachable"]
    back = step(j, other.status, tp=pods("trainer", 2), rp=pods("rollout", 2), ledger=other.ledger,
                trainer=TrainerStatus(phase="running", step=4, total_steps=20))
    assert cond(back.status, "TrainerReachable").reason == "Reachable"


def test_a_trainer_still_starting_is_not_called_unreachable():
    j = job()
    d = step(j, initial_status(T0), tp=pods("trainer", 2, ready=False), rp=pods("rollout", 2), error=UNREACHABLE)
    c = cond(d.status, "TrainerReachable")
    assert (c.status, c.reason) == ("Unknown", "Starting")
    assert not [e for e in transitions(initial_status(T0), d.status) if e.type == "Warning" and "Trainer" in e.message]


def test_total_steps_come_from_the_spec_before_the_trainer_reports():
    d = step(job(), initial_status(T0))
    assert d.status.progress.total_steps == 20 and d.status.progress.step == 0
    d = step(job(), d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), error=UNREACHABLE)
    assert d.status.progress.total_steps == 20 and d.status.message == f"the trainer does not answer: {UNREACHABLE}"


def test_every_condition_carries_a_transition_time_from_the_first_status():
    d = step(job(), initial_status(T0))
    assert [c.type for c in d.status.conditions] == list(CONDITION_TYPES)
    assert all(c.last_transition_time for c in d.status.conditions)
    assert cond(d.status, "WeightsInSync").status == "Unknown"
    # A status written before this rule (no times) gets them on the next look.
    bare = d.status.model_copy(deep=True)
    for c in bare.conditions:
        c.last_transition_time = None
    assert all(c.last_transition_time == "2026-01-01T01:00:00Z"
               for c in step(job(), bare, now=T0 + timedelta(hours=1)).status.conditions)


def test_rollout_lag_and_sync_backend_reach_the_status():
    t = TrainerStatus(phase="running", step=9, total_steps=20, policy_version=9, weights_in_sync=False,
                      rollouts=[RolloutLag(replica="j-rollout-a", version=9, lag=0),
                                RolloutLag(replica="j-rollout-b", version=8, lag=1)],
                      weight_sync_backend="nccl")
    d = step(job(), running_status(job()).status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=t)
    p = d.status.dump()["progress"]
    assert p["rollouts"] == [{"replica": "j-rollout-a", "version": 9, "lag": 0},
                             {"replica": "j-rollout-b", "version": 8, "lag": 1}]
    assert p["weightSyncBackend"] == "nccl"
    assert cond(d.status, "WeightsInSync").message == "policy version 9 (nccl)"


def test_the_last_evaluation_reaches_the_status_and_outlives_a_trainer_restart():
    ev = EvaluationStatus(step=8, policy_version=8, prompts=24, samples_per_prompt=4, reward_mean=0.5,
                          rewards={"toy": 0.5}, pass_at={"1": 0.25, "4": 0.75}, time="2026-01-01T00:00:05Z")
    t = TrainerStatus(phase="running", step=9, total_steps=20, policy_version=9, evaluation=ev)
    d = step(job(), running_status(job()).status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=t)
    assert d.status.dump()["progress"]["evaluation"] == {
        "step": 8, "policyVersion": 8, "prompts": 24, "samplesPerPrompt": 4, "rewardMean": 0.5,
        "rewards": {"toy": 0.5}, "passAt": {"1": 0.25, "4": 0.75}, "time": "2026-01-01T00:00:05Z"}
    # a restarted trainer reports no evaluation until its next one: the job keeps the last
    fresh = TrainerStatus(phase="running", step=9, total_steps=20, policy_version=9)
    again = step(job(), d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=fresh)
    assert again.status.progress.evaluation == ev


def test_suspend_asks_a_running_trainer_even_when_its_status_does_not_answer():
    """Both trainer pods Running and Ready, /status unreachable: ask, retry, never scale down
    without asking; after the timeout, scale down and say why."""
    j = job(runPolicy={"suspend": True})
    d = running_status(job())
    ask = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), error=UNREACHABLE, ledger=d.ledger)
    assert ask.request_suspend and ask.scale == Scale(2, 2) and ask.status.phase != "Suspended"
    failed = with_suspend_request(ask, "POST .../suspend: ClientConnectorError: connection refused", T0)
    c = cond(failed.status, "Suspended")
    assert (c.status, c.reason) == ("Unknown", "Checkpointing") and "connection refused" in c.message
    again = step(j, failed.status, now=T0 + timedelta(seconds=60), tp=pods("trainer", 2), rp=pods("rollout", 2),
                 error=UNREACHABLE, ledger=ask.ledger, suspend_timeout=600)
    assert again.request_suspend and again.scale == Scale(2, 2)
    late = step(j, again.status, now=T0 + timedelta(seconds=601), tp=pods("trainer", 2), rp=pods("rollout", 2),
                error=UNREACHABLE, ledger=again.ledger, suspend_timeout=600)
    c = cond(late.status, "Suspended")
    assert late.scale == Scale(0, 0) and late.status.phase == "Suspended"
    assert (c.status, c.reason) == ("True", "CheckpointTimeout")
    assert c.message.startswith("no checkpoint confirmed within 600s (the trainer's /status does not answer")
    assert any(e.type == "Warning" and e.reason == "CheckpointTimeout" for e in transitions(again.status, late.status))


def test_suspend_completes_on_the_trainers_clean_exit_even_unseen_in_status():
    j = job(runPolicy={"suspend": True})
    d = running_status(job())
    ask = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=TrainerStatus(phase="running"),
               ledger=d.ledger)
    exited = pods("trainer", 2)
    exited[0] = exited[0].__class__(**{**exited[0].__dict__, "restarts": 1, "clean_exit": True})
    done = step(j, ask.status, tp=exited, rp=pods("rollout", 2), error=UNREACHABLE, ledger=ask.ledger)
    assert done.scale == Scale(0, 0) and cond(done.status, "Suspended").reason == "Checkpointed"
    assert done.status.restarts == 0


def test_suspend_of_a_job_whose_trainer_pods_are_gone_says_so():
    j = job(runPolicy={"suspend": True})
    d = running_status(job())
    ask = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
               trainer=TrainerStatus(phase="running", step=5, last_checkpoint_step=4))
    gone = step(j, ask.status, tp=[], rp=pods("rollout", 2))
    c = cond(gone.status, "Suspended")
    assert gone.scale == Scale(0, 0) and (c.reason, c.message) == (
        "TrainerStopped", "the trainer stopped before confirming a checkpoint (newest checkpoint: step 4)")


def test_completion_needs_the_trainer_at_its_last_step():
    j = job()
    d = running_status(j)
    early = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
                 trainer=TrainerStatus(phase="completed", step=0, total_steps=20), ledger=d.ledger)
    assert early.status.phase == "Initializing" and early.status.message.startswith("the trainer says completed")
    done = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
                trainer=TrainerStatus(phase="completed", step=20, total_steps=20), ledger=d.ledger)
    assert done.status.phase == "Succeeded"


def test_a_report_behind_the_status_is_held_back_until_the_trainer_catches_up():
    """A restarted trainer says step 0 while it loads, then its checkpoint's step (older than its
    last report): progress stays at the last step reported, then moves on from there."""
    j = job()
    d = step(j, running_status(j).status, tp=pods("trainer", 2), rp=pods("rollout", 2),
             trainer=TrainerStatus(phase="running", step=12, total_steps=20, reward_mean=0.7))
    seen = []
    for t in (TrainerStatus(phase="starting", step=0), TrainerStatus(phase="running", step=10, reward_mean=0.1),
              TrainerStatus(phase="running", step=12, reward_mean=0.2),
              TrainerStatus(phase="running", step=13, reward_mean=0.3)):
        d = step(j, d.status, tp=pods("trainer", 2), rp=pods("rollout", 2), trainer=t, ledger=d.ledger)
        seen.append((d.status.progress.step, d.status.progress.reward_mean))
    assert seen == [(12, 0.7), (12, 0.7), (12, 0.2), (13, 0.3)]


def test_completion_read_from_pod_zeros_termination_message():
    j = job(runPolicy={"backoffLimit": 0})
    d = running_status(j)  # last report: step 3 of 20
    ended = PodView("j-trainer-0", "trainer-0", "trainer", phase="Running", restarts=1, completed_step=20,
                    message="trainer exited 1 (Error)")
    done = step(j, d.status, tp=[ended, *pods("trainer", 2)[1:]], rp=pods("rollout", 2), error=UNREACHABLE,
                ledger=d.ledger)
    assert done.status.phase == "Succeeded" and done.status.restarts == 0
    assert done.status.progress.step == 20 and done.status.message == "trained 20/20 steps"
    short = PodView("j-trainer-0", "trainer-0", "trainer", phase="Running", restarts=1, completed_step=19)
    assert step(j, d.status, tp=[short], rp=pods("rollout", 2), ledger=d.ledger).status.phase != "Succeeded"
    other = PodView("j-trainer-1", "trainer-1", "trainer", phase="Running", completed_step=20)  # not the leader
    assert step(j, d.status, tp=[pods("trainer", 1)[0], other], rp=pods("rollout", 2)).status.phase != "Succeeded"


def test_a_rollout_engine_failure_is_one_event_per_restart_and_no_failure():
    j = job()
    d = running_status(j)
    broken = PodView("j-rollout-0", "rollout-0", "rollout", phase="Running", ready=True, restarts=1,
                     engine_failure="CUDA error: out of memory")
    first = step(j, d.status, tp=pods("trainer", 2), rp=[broken, pods("rollout", 2)[1]], ledger=d.ledger,
                 trainer=TRAINING)
    assert first.events == [Event("Warning", "EngineFailed", "j-rollout-0: CUDA error: out of memory")]
    assert first.status.phase == "Running" and first.status.restarts == 0
    again = step(j, first.status, tp=pods("trainer", 2), rp=[broken, pods("rollout", 2)[1]], ledger=first.ledger)
    assert again.events == []
    twice = PodView(**{**broken.__dict__, "restarts": 2})
    assert [e.reason for e in step(j, again.status, tp=pods("trainer", 2), rp=[twice], ledger=again.ledger).events] \
        == ["EngineFailed"]


def test_suspending_ephemeral_checkpoints_is_refused_once_a_trainer_has_run():
    eph = {**PER_POD, "storage": "ephemeral"}  # an emptyDir per trainer pod (the status rules alone, here)
    fresh = step(job(checkpoint=eph, runPolicy={"suspend": True}), initial_status(T0))
    assert fresh.status.phase == "Suspended"  # nothing ran: nothing to lose (a queue creates jobs suspended)
    # once per spec generation
    storage = [e for e in fresh.events if "spec.checkpoint.storage" in e.message]
    assert [e.reason for e in storage] == ["SpecWarning"] and len(fresh.events) == 1
    d = running_status(job(checkpoint=eph))
    refused = step(job(checkpoint=eph, runPolicy={"suspend": True}), d.status, tp=pods("trainer", 2),
                   rp=pods("rollout", 2), trainer=TrainerStatus(phase="running", step=4), ledger=d.ledger)
    c = cond(refused.status, "Suspended")
    assert (c.status, c.reason) == ("False", "SuspendRefused") and "ephemeral" in c.message
    assert refused.scale == Scale(2, 2) and not refused.request_suspend and refused.status.phase == "Running"
    assert [e.reason for e in transitions(d.status, refused.status) if e.type == "Warning"] == ["SuspendRefused"]
    back = step(job(checkpoint=eph), refused.status, tp=pods("trainer", 2), rp=pods("rollout", 2),
                ledger=refused.ledger)
    assert cond(back.status, "Suspended").reason == "NotSuspended"
