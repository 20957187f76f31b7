"""Which edits a running job accepts: rollout scaling and the run policy, nothing else."""
from __future__ import annotations

from grpojob.api import parse
from grpojob_operator.changes import effective, immutable_changes

from .conftest import job_manifest


def job(**spec):
    return parse(job_manifest("j", **spec))


def test_mutable_fields_pass_and_others_are_named():
    applied = job()
    assert immutable_changes(applied, job(rollout={"replicas": 5}, runPolicy={"suspend": True})) == []
    msgs = immutable_changes(applied, job(trainer={"replicas": 1}, training={"learningRate": 0.1}))
    assert msgs == [
        "spec.trainer.replicas cannot change on a running job (running with 2, asked for 1); "
        "revert it, or suspend the job first",
        "spec.training.learningRate cannot change on a running job (running with 1e-06, asked for 0.1); "
        "revert it, or suspend the job first"]


def test_an_edit_with_a_refused_field_is_refused_whole():
    applied = job()
    new = job(trainer={"replicas": 1}, rollout={"replicas": 3}, runPolicy={"suspend": True})
    eff, refused = effective(new, applied, "active")
    assert refused[0].startswith("spec.trainer.replicas cannot change")
    assert refused[1] == ("the rest of the edit (spec.rollout.replicas, spec.runPolicy.suspend) is not applied "
                          "either: an edit applies whole or not at all")
    assert eff == applied  # nothing half-applied: the rollouts stay at 2, the job is not suspended
    scaled = job(rollout={"replicas": 3})
    assert effective(scaled, applied, "active") == (scaled, [])


def test_suspended_jobs_take_every_change_and_finished_ones_say_nothing():
    applied, new = job(), job(trainer={"replicas": 1})
    assert effective(new, applied, "suspended") == (new, [])
    eff, refused = effective(new, applied, "finished")
    assert refused == [] and eff.spec.trainer.replicas == 2
    assert effective(new, None, "active") == (new, [])


def test_checkpoint_storage_never_changes_not_even_while_suspended():
    """It shapes the trainer StatefulSet's volumeClaimTemplates, which the API server refuses to
    change ("updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template',
    'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden")."""
    per_pod = {"volumeClaim": None}  # the claims of the StatefulSet's volumeClaimTemplates
    applied = job(checkpoint=per_pod, runPolicy={"suspend": True})
    for change in ({"size": "50Gi"}, {"storageClassName": "fast"}, {"storage": "ephemeral"}, {"volumeClaim": "c"}):
        new = job(checkpoint={**per_pod, **change}, runPolicy={"suspend": False})
        eff, refused = effective(new, applied, "suspended")
        field = next(iter(change))
        assert eff == applied and refused[0].startswith(f"spec.checkpoint.{field} cannot change after the job is "
                                                        "created"), refused
        assert refused[-1] == ("the rest of the edit (spec.runPolicy.suspend) is not applied either: an edit "
                               "applies whole or not at all")
    moved = job(checkpoint={**per_pod, "path": "/elsewhere"}, runPolicy={"suspend": True})  # the mount path is the pod template's: it may change
    assert effective(moved, applied, "suspended") == (moved, [])


def test_a_kueue_gang_keeps_its_rollout_count_while_it_runs_and_takes_a_new_one_suspended():
    """The gang's size is in every pod's template (gang.py): a new rollout count is a new gang."""
    gang = {"gang": "kueue", "queueName": "gpu"}
    applied, new = job(scheduling=gang), job(scheduling=gang, rollout={"replicas": 4})
    eff, refused = effective(new, applied, "active")
    assert eff == applied and refused == [
        "spec.rollout.replicas cannot change on a running job with scheduling.gang kueue (running with 2, asked for "
        "4): its trainer and rollout pods are one Kueue pod group whose size is in every pod's template, so a new "
        "count is a new gang that restarts every pod; suspend the job, change it, resume"]
    assert effective(new, applied, "suspended") == (new, [])
    volcano = {"gang": "volcano", "queueName": "q"}  # its count is in the PodGroup, patched in place
    assert effective(job(scheduling=volcano, rollout={"replicas": 4}), job(scheduling=volcano), "active")[1] == []
