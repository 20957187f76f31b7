"""Rules of a real cluster that the kmock emulator does not have, acted out (cluster.py,
acted_trainer.py, tests/helpers/statefulset.py) around the real operator, each cited where it is
acted out:

- a StatefulSet's pods have restartPolicy Always: a container that exits is restarted, exit code 0
  included (cluster.Cluster.container_exited);
- an emptyDir is deleted with its pod, a PersistentVolumeClaim from a StatefulSet's
  volumeClaimTemplates outlives a scale-down (whenScaled: Retain) and goes with the StatefulSet
  (whenDeleted: Delete) (acted_trainer.ActedTrainer, statefulset.claims, the acted-out garbage
  collector);
- a rollout server whose engine broke exits non-zero with an EngineFailed termination message and
  the kubelet restarts it.

The acted-out trainer follows the runtime's contract (tests/trainer/test_completion.py and
test_main.py check the real one): step 0 until its checkpoint is loaded, "completed" held until
the pod is stopped, the completion also in its termination message.
"""
from __future__ import annotations

import asyncio
from typing import Any

from grpojob.api import plugins
from grpojob_operator import names as n
from grpojob_operator.pods import CHECKPOINTS_VOLUME

from .acted_trainer import ActedTrainer
from .cluster import Cluster, eventually
from .conftest import NS, PER_POD, job_manifest, job_path
from .harness import TrainerStub
from .kmock_shim import EVENTS, GRPOJOBS, PVCS, STATEFULSETS, Emulator
from .test_operator import cond, replicas, status

SMALL = dict(trainer={"replicas": 1, "processesPerReplica": 1}, rollout={"replicas": 1}, checkpoint=PER_POD)


def progress_steps(emu: Emulator, name: str) -> list[int]:
    """Every status.progress.step the operator wrote for the job, in order (its status patches are
    merge patches: a step is in one when it changed)."""
    out = []
    for r in emu.requests_for(GRPOJOBS, "update"):
        if r.subresource == "status" and r.name == name:
            step = (((r.data or {}).get("status") or {}).get("progress") or {}).get("step")
            if step is not None:
                out.append(step)
    return out


def events_of(emu: Emulator, job: str) -> list[dict[str, Any]]:
    return [e for e in emu.live(EVENTS, NS) if e.get("involvedObject", {}).get("name") == job]


async def started(emu: Emulator, cluster: Cluster, trainer: TrainerStub, name: str, total: int,
                  every: int = 1, **spec: Any) -> ActedTrainer:
    """Create the job, run its pods, start the acted-out trainer in pod 0; Running."""
    spec["checkpoint"] = {**PER_POD, **spec.get("checkpoint", {})}
    await cluster.create(job_path(), job_manifest(name, **{**SMALL, "training": {"steps": total}, **spec}))
    await eventually(lambda: len(cluster.pods(NS, name)) == 2, what="pods")
    await cluster.run_pods(NS, name)
    actor = ActedTrainer(emu, trainer, NS, name, total, every)
    await actor.start()
    await eventually(lambda: status(emu, name).get("phase") == "Running", what=f"{name} Running")
    return actor


async def test_a_finished_job_succeeds_with_zero_trainer_restarts(emulator, cluster, operator, trainer):
    """The trainer holds after its last step; the operator reads "completed" and scales the job
    down. It never asks the finished trainer to exit (POST /suspend): under restartPolicy Always a
    process that exits is restarted."""
    actor = await started(emulator, cluster, trainer, "fin", 3)
    await actor.train(3)
    await eventually(lambda: status(emulator, "fin").get("phase") == "Succeeded", what="Succeeded")
    st = status(emulator, "fin")
    assert st["restarts"] == 0 and st["completionTime"] and st["message"] == "trained 3/3 steps"
    assert st["progress"]["step"] == 3 and st["progress"]["weightsInSync"] is True
    assert cond(emulator, "fin", "WeightsInSync")["status"] == "True"
    await eventually(lambda: replicas(emulator, "fin") == (0, 0), what="scaled down")
    await eventually(lambda: not cluster.pods(NS, "fin"), what="pods gone")
    assert trainer.suspends == []
    steps = progress_steps(emulator, "fin")
    assert steps == sorted(steps) and steps[-1] == 3


async def test_a_trainer_that_ended_after_finishing_is_recorded_complete_from_its_termination_message(
        emulator, cluster, operator, trainer):
    """The finished trainer's container ends before the operator read /status (evicted, killed;
    here it exits 1, as torchrun does on SIGTERM); the kubelet restarts it and the new process says
    step 0 while it loads. The operator records completion from the termination message the kubelet
    kept, counts no failure (backoffLimit 0 would fail the job), and progress does not drop to 0."""
    actor = await started(emulator, cluster, trainer, "ended", 3, runPolicy={"backoffLimit": 0})
    await actor.train(2)
    await eventually(lambda: status(emulator, "ended").get("progress", {}).get("step") == 2, what="step 2")
    trainer.unreachable.add((NS, "ended"))  # the operator does not see the last step in /status
    await actor.train(3)
    pod0 = f"{n.trainer_name('ended')}-0"
    await cluster.container_exited(NS, pod0, 1, actor.termination_message)
    trainer.unreachable.discard((NS, "ended"))
    trainer.set(NS, "ended", phase="starting", step=0, policyVersion=0)  # restarted, loading
    await eventually(lambda: status(emulator, "ended").get("phase") == "Succeeded", what="Succeeded")
    st = status(emulator, "ended")
    assert st["restarts"] == 0 and st["message"] == "trained 3/3 steps"
    assert plugins.parse_completion(actor.termination_message) == 3
    steps = progress_steps(emulator, "ended")
    assert steps == sorted(steps) and 0 not in steps[1:], steps


async def test_progress_never_goes_back_while_a_restarted_trainer_catches_up(emulator, cluster, operator, trainer):
    """A crash at step 3 of 5 with the newest checkpoint at 2: the kubelet restarts the container,
    the new process reports 0, then 2, then 3... The status holds step 3 until the trainer is past it."""
    actor = await started(emulator, cluster, trainer, "back", 5, every=2)
    await actor.train(3)
    await eventually(lambda: status(emulator, "back").get("progress", {}).get("step") == 3, what="step 3")
    await cluster.container_exited(NS, f"{n.trainer_name('back')}-0", 1)
    assert await actor.start() == 2  # it resumed from its checkpoint, behind its last report
    await eventually(lambda: status(emulator, "back").get("restarts") == 1, what="the crash counted")
    assert status(emulator, "back")["progress"]["step"] == 3
    await actor.train(5)
    await eventually(lambda: status(emulator, "back").get("phase") == "Succeeded", what="Succeeded")
    steps = progress_steps(emulator, "back")
    assert steps == sorted(steps) and steps[-1] == 5, steps
    assert status(emulator, "back")["restarts"] == 1


async def test_suspend_on_default_storage_resumes_from_the_checkpoint(emulator, cluster, operator, trainer):
    """Default checkpoint storage: a claim per trainer pod from the StatefulSet's template. Suspend
    scales the trainer to zero (its pod, and an emptyDir with it, is deleted); the claim stays, and
    the resumed trainer continues from its checkpoint. Deleting the job deletes the claim."""
    actor = await started(emulator, cluster, trainer, "sus", 4)
    trainer.on_suspend = lambda ns, name: actor.suspend()
    await actor.train(2)
    claim = actor.checkpoint_claim
    assert claim == f"{CHECKPOINTS_VOLUME}-{n.trainer_name('sus')}-0"  # <template>-<statefulset>-<ordinal>
    await cluster.patch(job_path(NS, "sus"), {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: status(emulator, "sus").get("phase") == "Suspended", what="Suspended")
    await eventually(lambda: not cluster.pods(NS, "sus"), what="pods gone")
    assert emulator.get_obj(PVCS, NS, claim) is not None, "the claim went with the pod"
    # The claim template cannot change, not even now (the API server refuses such a StatefulSet
    # update, acted out in admission.py): the operator refuses the edit instead of failing to apply it.
    sts_path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/{n.trainer_name('sus')}"
    async with emulator.request("PATCH", sts_path, json={"spec": {"volumeClaimTemplates": []}}) as resp:
        assert resp.status == 422
    await cluster.patch(job_path(NS, "sus"), {"spec": {"checkpoint": {"size": "50Gi"}}})
    await eventually(lambda: cond(emulator, "sus", "InvalidSpec").get("reason") == "ImmutableFieldChanged",
                     what="storage edit refused")
    assert "spec.checkpoint.size cannot change after the job is created" in cond(emulator, "sus", "InvalidSpec")["message"]
    assert cond(emulator, "sus", "Created")["status"] == "True"
    await cluster.patch(job_path(NS, "sus"), {"spec": {"checkpoint": {"size": "10Gi"}}})
    await eventually(lambda: cond(emulator, "sus", "InvalidSpec").get("status") == "False", what="edit reverted")

    await cluster.patch(job_path(NS, "sus"), {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(lambda: len(cluster.pods(NS, "sus")) == 2, what="pods again")
    await cluster.run_pods(NS, "sus")
    assert await actor.start() == 2, "the resumed trainer lost its checkpoint"
    await eventually(lambda: status(emulator, "sus").get("phase") == "Running", what="Running again")
    assert status(emulator, "sus")["progress"]["step"] == 2
    await actor.train(4)
    await eventually(lambda: status(emulator, "sus").get("phase") == "Succeeded", what="Succeeded")
    steps = progress_steps(emulator, "sus")
    assert steps == sorted(steps), steps

    await cluster.delete(job_path(NS, "sus"))  # the garbage collector takes StatefulSet, then claim
    await eventually(lambda: emulator.get_obj(STATEFULSETS, NS, n.trainer_name("sus")) is None, what="sts gone")
    await eventually(lambda: emulator.get_obj(PVCS, NS, claim) is None, what="claim gone with the job")


async def test_suspend_with_ephemeral_checkpoints_is_refused_with_a_condition_and_an_event(
        emulator, cluster, operator, trainer):
    """checkpoint.storage ephemeral: an emptyDir, deleted with the pod that suspend scales away,
    so a resumed trainer would start at step 0: the operator refuses to suspend and says why."""
    actor = await started(emulator, cluster, trainer, "eph", 4, checkpoint={"storage": "ephemeral"})
    assert actor.checkpoint_claim is None  # an emptyDir
    assert any(e["reason"] == "SpecWarning" and "spec.checkpoint.storage" in e["message"]
               for e in events_of(emulator, "eph"))
    await actor.train(1)
    await cluster.patch(job_path(NS, "eph"), {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: cond(emulator, "eph", "Suspended").get("reason") == "SuspendRefused", what="refused")
    c = cond(emulator, "eph", "Suspended")
    assert c["status"] == "False" and "spec.checkpoint.storage is ephemeral" in c["message"]
    await eventually(lambda: any(e["type"] == "Warning" and e["reason"] == "SuspendRefused"
                                 for e in events_of(emulator, "eph")), what="Warning Event")
    assert status(emulator, "eph")["phase"] == "Running" and replicas(emulator, "eph") == (1, 1)
    assert trainer.suspends == []
    await cluster.patch(job_path(NS, "eph"), {"spec": {"runPolicy": {"suspend": False}}})
    await eventually(lambda: cond(emulator, "eph", "Suspended").get("reason") == "NotSuspended", what="withdrawn")


async def test_a_broken_rollout_engine_is_an_event_per_termination_not_a_failure(emulator, cluster, operator,
                                                                                 trainer):
    await started(emulator, cluster, trainer, "eng", 10)
    pod = cluster.pods(NS, "eng", "rollout")[0]["metadata"]["name"]
    error = "CUDA error: an illegal memory access was encountered"
    message = plugins.failure_message(plugins.ENGINE_FAILED, [error])

    def engine_events() -> list[dict[str, Any]]:
        return [e for e in events_of(emulator, "eng") if e["reason"] == "EngineFailed"]

    await cluster.container_exited(NS, pod, 1, message)
    await eventually(lambda: engine_events(), what="EngineFailed Event")
    (event,) = engine_events()
    assert event["type"] == "Warning" and event["message"] == f"{pod}: {error}"
    await asyncio.sleep(1.0)  # five looks of the operator at the same restarted pod: no new Event
    assert len(engine_events()) == 1
    assert status(emulator, "eng")["phase"] == "Running" and status(emulator, "eng")["restarts"] == 0
    await cluster.container_exited(NS, pod, 1, plugins.failure_message(plugins.ENGINE_FAILED, ["engine dead"]))
    await eventually(lambda: len(engine_events()) == 2, what="a second termination, a second Event")
    assert engine_events()[-1]["message"] == f"{pod}: engine dead"
    assert status(emulator, "eng")["restarts"] == 0 and status(emulator, "eng")["phase"] == "Running"
