"""The real operator (kopf, against the kmock emulator; cluster.py acts out the StatefulSet
controller and the kubelet) with a colocated job: exactly its children (no rollout Deployment or
Service), its one trainer pod counted as the engine's too, and the trainer's word that it takes
turns in the job's status."""
from __future__ import annotations

from grpojob.api import parse
from grpojob_operator import children
from tests.helpers.k8s_schema import validate_all

from .cluster import eventually
from .conftest import NS, job_manifest, job_path
from .kmock_shim import GRPOJOBS
from .test_operator import cond, kids, status, without_server_fields

SPEC = dict(placement="colocated", trainer={"replicas": 1}, rollout={"replicas": 1})


async def test_a_colocated_job_runs_in_its_trainer_pod(emulator, cluster, operator, trainer):
    await cluster.create(job_path(), job_manifest("colo", **SPEC))
    await eventually(lambda: cond(emulator, "colo", "Created").get("status") == "True", what="Created")
    uid = emulator.get_obj(GRPOJOBS, NS, "colo")["metadata"]["uid"]
    expected = children.build(parse(job_manifest("colo", **SPEC)), namespace=NS, image=operator.cfg.image,
                              owner=children.owner_reference("colo", uid))
    have = kids(emulator, "colo")
    assert sorted(have) == sorted(children.key(o) for o in expected)
    assert not any(kind == "Deployment" for kind, _ in have)
    for obj in expected:
        assert without_server_fields(have[children.key(obj)]) == obj
    assert validate_all(have.values()) == len(expected)

    trainer.set(NS, "colo", phase="running", totalSteps=20, step=3, placement="colocated (turn-taking)",
                weightSyncBackend="shm")
    await eventually(lambda: len(cluster.pods(NS, "colo")) == 1, what="the trainer pod")
    await cluster.run_pods(NS, "colo")
    await eventually(lambda: status(emulator, "colo").get("phase") == "Running", what="Running")
    await eventually(lambda: status(emulator, "colo").get("progress", {}).get("step") == 3, what="progress")
    st = status(emulator, "colo")
    assert st["trainer"] == {"desired": 1, "ready": 1} and st["rollout"] == {"desired": 1, "ready": 1}
    assert cond(emulator, "colo", "RolloutReady")["status"] == "True"
    assert st["progress"]["placement"] == "colocated (turn-taking)" and st["progress"]["weightSyncBackend"] == "shm"

