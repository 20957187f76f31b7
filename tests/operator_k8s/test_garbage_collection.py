"""A deleted job takes every object made for it (issue 31, item 6), through owner references only:
the operator deletes nothing itself. kmock has no garbage collector; cluster.py acts it out with the
real rule: "a namespaced owner must exist in the same namespace as the dependent ... the dependent
is subject to deletion once all owners are verified absent"
(https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents;
kubernetes/kubernetes pkg/controller/garbagecollector/garbagecollector.go, attemptToDeleteItem).

The chain, object by object: the GRPOJob owns its Secret, ConfigMap, Services, NetworkPolicies,
StatefulSet, Deployments, PodGroup (Volcano) and PodMonitor; the StatefulSet owns its pods and, with
persistentVolumeClaimRetentionPolicy whenDeleted Delete, its checkpoint claims (tests/helpers/
statefulset.py); a Deployment owns its pods (through a ReplicaSet); Kueue's Workload for a pod group
is owned by every pod of the group (kubernetes-sigs/kueue pkg/controller/jobs/pod/pod_controller.go).
What the job only names (spec.model.volumeClaim, spec.checkpoint.volumeClaim, spec.code's
ConfigMap) is the user's, owned by nobody here, and stays.
"""
from __future__ import annotations

from typing import Any

import kmock
import pytest
from kmock._internal import references

from grpojob_operator import names as n

from .cluster import Cluster, eventually
from .conftest import NS, ONE_POD, PER_POD, job_manifest, job_path
from .kmock_shim import GRPOJOBS, PODS, PVCS, Emulator
from .test_operator import cond

PODGROUPS = kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
PODMONITORS = kmock.resource("monitoring.coreos.com", "v1", "podmonitors")
WORKLOADS = kmock.resource("kueue.x-k8s.io", "v1beta1", "workloads")


def serve(emu: Emulator, resource: Any, kind: str) -> None:
    """The cluster has this CRD installed (Volcano's, the Prometheus Operator's, Kueue's)."""
    emu.resources[resource] = references.ResourceInfo(
        kind=kind, singular=kind.lower(), namespaced=True, shortnames=set(),
        verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources=set())


def everything(emu: Emulator, ns: str = NS) -> dict[tuple[str, str], dict[str, Any]]:
    """Every live object in the namespace but Events (they expire on their own, by TTL)."""
    return {(res.plural, key[2]): obj.raw for key, obj in list(emu.objects.items())
            for res in [key[0]] if key[1] == ns and not obj.deleted and res.plural != "events"}


def owned_by(objs: dict[tuple[str, str], dict[str, Any]], root_uid: str) -> set[tuple[str, str]]:
    """The objects whose owner references lead to `root_uid`, directly or through their owners'.
    (A Deployment's pods here name the Deployment's uid as their ReplicaSet's: cluster.Cluster._pod.)"""
    out: set[tuple[str, str]] = set()
    reached = {root_uid}
    changed = True
    while changed:
        changed = False
        for k, o in objs.items():
            refs = [r["uid"] for r in o["metadata"].get("ownerReferences") or []]
            if k not in out and any(u in reached for u in refs):
                out.add(k)
                reached.add(o["metadata"]["uid"])
                changed = True
    return out


@pytest.mark.parametrize("gang", ["volcano", "kueue"])
async def test_deleting_a_job_collects_every_child_and_keeps_what_the_user_named(emulator, cluster: Cluster,
                                                                                 operator, trainer, gang):
    for res, kind in ((PODGROUPS, "PodGroup"), (PODMONITORS, "PodMonitor"), (WORKLOADS, "Workload")):
        serve(emulator, res, kind)
    # The user's own claim for the model: named by the job, never owned by it.
    await cluster.create(f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights", "namespace": NS},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    name = f"gc-{gang}"
    await cluster.create(job_path(), job_manifest(
        name, model={"path": "/models/m", "volumeClaim": "weights"}, monitoring={"podMonitor": True},
        scheduling={"gang": gang, "queueName": "q"}, trainer=ONE_POD, checkpoint=PER_POD,  # a claim of its own
        environments=[{"name": "calc", "command": ["python", "-m", "calc"]}]))
    await eventually(lambda: cond(emulator, name, "Created").get("status") == "True", what="children")
    await eventually(lambda: len(cluster.pods(NS, name)) == 4, what="pods (1 trainer, 2 rollout, 1 environment)")
    await cluster.run_pods(NS, name)
    job_uid = emulator.get_obj(GRPOJOBS, NS, name)["metadata"]["uid"]
    if gang == "kueue":  # Kueue makes the group's Workload, owned by every pod of the group
        members = [p for p in cluster.pods(NS, name) if "kueue.x-k8s.io/pod-group-name" in p["metadata"]["labels"]]
        assert len(members) == int(members[0]["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"]) == 3
        await cluster.create(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
                for p in members]}, "spec": {"queueName": "q", "podSets": []}})

    objs = everything(emulator)
    made = {k for k, o in objs.items() if (o["metadata"].get("labels") or {}).get(n.LABEL_JOB) == name}
    expected_kinds = {"secrets", "configmaps", "services", "networkpolicies", "statefulsets", "deployments",
                      "pods", "persistentvolumeclaims", "podmonitors"} | ({"podgroups"} if gang == "volcano" else set())
    assert {k[0] for k in made} == expected_kinds, made
    chain = owned_by(objs, job_uid)
    assert made <= chain, f"not owned, directly or through an owner: {sorted(made - chain)}"
    for k in made:  # every direct child of the job names it as its controller
        refs = objs[k]["metadata"].get("ownerReferences") or []
        if refs[0]["uid"] == job_uid:
            assert refs == [{"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "name": name, "uid": job_uid,
                             "controller": True, "blockOwnerDeletion": True}], k
    if gang == "kueue":
        assert ("workloads", name) in chain
    claims = [k for k in made if k[0] == "persistentvolumeclaims"]
    assert sorted(c[1] for c in claims) == [f"grpojob-checkpoints-{n.trainer_name(name)}-0"]

    await cluster.delete(job_path(NS, name))
    await eventually(lambda: emulator.get_obj(GRPOJOBS, NS, name) is None, what="job gone (kopf's finalizer released)")
    await eventually(lambda: not (set(everything(emulator)) & (chain | made)), timeout=20,
                     what="every object made for the job collected")
    left = everything(emulator)
    assert ("persistentvolumeclaims", "weights") in left  # the user's, kept
    assert not [k for k in left if k[0] in ("pods", "workloads")]
    assert emulator.get_obj(PVCS, NS, "weights") is not None and not emulator.live(PODS, NS)
