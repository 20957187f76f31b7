"""Rendering a GRPOJob into Kubernetes objects (pure functions): exact children, strict schema
validation, and the same commands as `grpojob run`."""
from __future__ import annotations

import copy
import os

import pytest

from grpojob import plan
from grpojob.api import load_file, parse
from grpojob_operator import children
from grpojob_operator import names as n
from grpojob_operator import pods
from tests.helpers.k8s_schema import ROOT, validate_all

from .conftest import ONE_POD, PER_POD, job_manifest

UID = "0f6c2c35-2d1b-4ad0-9d43-0a1b2c3d4e5f"
OWNER = children.owner_reference("j", UID)


def build(manifest: dict, **kw) -> dict[tuple[str, str], dict]:
    job = parse(manifest)
    return {children.key(o): o for o in children.build(job, namespace="ml", owner=OWNER, **kw)}


def container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_a_job_gets_exactly_its_seven_children_in_order_with_owner_and_labels():
    objs = children.build(parse(job_manifest("j")), namespace="ml", owner=OWNER)
    assert [children.key(o) for o in objs] == [
        ("NetworkPolicy", "j-trainer"), ("NetworkPolicy", "j-rollout"),  # before any pod runs
        ("ConfigMap", "j-config"), ("Service", "j-trainer"), ("Service", "j-rollout"),
        ("StatefulSet", "j-trainer"), ("Deployment", "j-rollout")]
    off = children.build(parse(job_manifest("j", network={"policy": False})), namespace="ml", owner=OWNER)
    assert [children.key(o) for o in off] == [children.key(o) for o in objs[2:]]
    for o in objs:
        assert o["metadata"]["namespace"] == "ml"
        assert o["metadata"]["ownerReferences"] == [{
            "apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "name": "j", "uid": UID,
            "controller": True, "blockOwnerDeletion": True}]
        labels = o["metadata"]["labels"]
        assert labels[n.LABEL_JOB] == "j" and labels[n.LABEL_MANAGED_BY] == "grpojob-operator"
        assert labels[n.LABEL_INSTANCE] == "j" and labels[n.LABEL_NAME] == "grpojob"
        assert o["metadata"]["annotations"][n.ANN_HASH] == children.spec_hash(o)


VARIANTS = {
    "qwen-example": load_file(ROOT / "examples" / "qwen-gsm8k.yaml"),
    "tiny-example": load_file(ROOT / "examples" / "tiny-local.yaml"),
    "everything": job_manifest(
        "j",
        model={"path": "/models/m", "volumeClaim": "models"},
        checkpoint={"volumeClaim": "ckpt", "path": "/ckpt"},
        weightSync={"backend": "checkpoint"},
        trainer={"image": "my/trainer:1", "imagePullPolicy": "Always",
                 "resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 2},
                               "limits": {"nvidia.com/gpu": 2}},
                 "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                         {"name": "NCCL_DEBUG", "value": "INFO"}],
                 "nodeSelector": {"gpu": "h100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                 "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                     {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                       "labelSelector": {"matchLabels": {"grpojob.io/job": "j"}}}}]}},
                 "priorityClassName": "high", "serviceAccountName": "trainer",
                 "labels": {"team": "rl"}, "annotations": {"note": "x"}},
        rollout={"replicas": 3, "backend": "vllm", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        scheduling={"gang": "kueue", "queueName": "gpu"},
        monitoring={"podMonitor": True}),
    "volcano": job_manifest("j", scheduling={"gang": "volcano", "queueName": "q"}),
    # spec.placement colocated: the engine is a second container of the one trainer pod
    "colocated": job_manifest("j", placement="colocated", trainer={"replicas": 1},
                              rollout={"replicas": 1, "backend": "vllm", "resources": {"requests": {"cpu": "2"}}},
                              scheduling={"gang": "volcano", "queueName": "q"}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_child_passes_strict_kubernetes_validation(variant):
    objs = list(build(copy.deepcopy(VARIANTS[variant])).values())
    validated = validate_all(objs)
    assert validated == sum(1 for o in objs if o["kind"] not in ("PodGroup", "PodMonitor"))


def test_trainer_statefulset_runs_torchrun_ranks_with_rendezvous_on_pod_zero():
    kids = build(job_manifest("j"))
    sts, svc = kids[("StatefulSet", "j-trainer")], kids[("Service", "j-trainer")]
    spec = sts["spec"]
    assert spec["replicas"] == 2 and spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == "j-trainer"
    assert spec["selector"]["matchLabels"] == {n.LABEL_JOB: "j", n.LABEL_ROLE: "trainer"}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"rendezvous": 29500, "sync": 29600, "http": 9400}

    c = container(sts)
    env = env_of(c)
    assert c["command"] == ["grpojob", "torchrun"]
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_MASTER_ADDR"] == "j-trainer-0.j-trainer.ml.svc" and env["PET_MASTER_PORT"] == "29500"
    assert env["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    assert env[plan.ENV_CONFIG] == "/etc/grpojob/grpojob.json"
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/etc/grpojob": "grpojob-config", "/var/run/grpojob": "grpojob-run", "/dev/shm": "grpojob-shm",
                      "/home/grpojob": "grpojob-home", "/tmp": "grpojob-tmp", "/checkpoints": "grpojob-checkpoints",
                      "/var/run/secrets/grpojob": "grpojob-token"}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["grpojob-shm"]["emptyDir"] == {"medium": "Memory"}
    assert volumes["grpojob-config"]["configMap"] == {"name": "j-config"}
    assert kids[("ConfigMap", "j-config")]["data"][plan.CONFIG_FILE] == plan.render_config(parse(job_manifest("j")))


def test_user_settings_reach_the_pods_but_never_the_selector_labels():
    m = copy.deepcopy(VARIANTS["everything"])
    m["spec"]["trainer"]["labels"] = {"team": "rl", n.LABEL_ROLE: "hijack", n.LABEL_JOB: "other"}
    kids = build(m)
    pod = kids[("StatefulSet", "j-trainer")]["spec"]["template"]
    ps, c = pod["spec"], pod["spec"]["containers"][0]
    assert pod["metadata"]["labels"][n.LABEL_ROLE] == "trainer" and pod["metadata"]["labels"][n.LABEL_JOB] == "j"
    assert pod["metadata"]["labels"]["team"] == "rl" and pod["metadata"]["annotations"]["note"] == "x"
    assert c["image"] == "my/trainer:1" and c["imagePullPolicy"] == "Always"
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"},
                              "limits": {"nvidia.com/gpu": "2"}}
    assert ps["nodeSelector"] == {"gpu": "h100"} and ps["priorityClassName"] == "high"
    assert ps["serviceAccountName"] == "trainer" and ps["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "podAntiAffinity" in ps["affinity"]
    env = env_of(c)
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}} and env["NCCL_DEBUG"] == "INFO"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and mounts["/ckpt"]["name"] == "grpojob-checkpoints"
    volumes = {v["name"]: v for v in ps["volumes"]}
    assert volumes["grpojob-checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    # weightSync.backend checkpoint: the rollouts read the same claim, read-only.
    rc = container(kids[("Deployment", "j-rollout")])
    assert {m["mountPath"]: m.get("readOnly") for m in rc["volumeMounts"]}["/ckpt"] is True


def test_a_user_variable_with_a_plan_name_replaces_it_in_place():
    m = job_manifest("j", trainer={"env": [{"name": "PYTHONUNBUFFERED", "value": "0"}]})
    env = container(build(m)[("StatefulSet", "j-trainer")])["env"]
    assert [e["name"] for e in env].count("PYTHONUNBUFFERED") == 1
    assert env_of({"env": env})["PYTHONUNBUFFERED"] == "0"


def test_openmp_threads_wait_passively_in_every_pod_unless_the_user_sets_it():
    """Processes of a job share cores (a server generates while the trainer waits; servers share a
    node): OpenMP's spinning idle threads made two CPU servers 16x slower than one (plan.THREAD_ENV)."""
    objs = build(job_manifest("j", rollout={"env": [{"name": "OMP_WAIT_POLICY", "value": "ACTIVE"}]}))
    assert env_of(container(objs[("StatefulSet", "j-trainer")]))["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env_of(container(objs[("Deployment", "j-rollout")]))["OMP_WAIT_POLICY"] == "ACTIVE"


def test_rollout_deployment_finds_the_trainer_store_through_the_headless_service():
    kids = build(job_manifest("j"))
    dep = kids[("Deployment", "j-rollout")]
    c = container(dep)
    env = env_of(c)
    assert dep["spec"]["replicas"] == 2
    assert c["command"] == ["grpojob", "rollout"]
    assert env[plan.ENV_SYNC_ADDR] == "j-trainer-0.j-trainer.ml.svc:29600"
    assert env[plan.ENV_ADVERTISE_HOST] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[plan.ENV_REPLICA_ID] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert kids[("Service", "j-rollout")]["spec"]["selector"] == {n.LABEL_JOB: "j", n.LABEL_ROLE: "rollout"}


def test_gang_scheduling_hints():
    """One gang holds the whole job (issue 31), exactly as the projects document it.

    Kueue, plain Pod groups (https://kueue.sigs.k8s.io/docs/tasks/run/plain_pods/): every member
    carries the pod-group-name label and the pod-group-total-count annotation, consistently, and
    the queue-name label; serving and role-hash as Kueue's own source sets them (gang.py). The
    workloads carry no queue label (Kueue's statefulset/deployment integrations would split the gang)."""
    kueue = build(job_manifest("j", scheduling={"gang": "kueue", "queueName": "gpu"}))
    sts, dep = kueue[("StatefulSet", "j-trainer")], kueue[("Deployment", "j-rollout")]
    for workload in (sts, dep):
        assert not any(k.startswith("kueue.x-k8s.io/") for k in workload["metadata"]["labels"])
    for tmpl, role in ((sts["spec"]["template"]["metadata"], "trainer"), (dep["spec"]["template"]["metadata"], "rollout")):
        assert {k: v for k, v in tmpl["labels"].items() if k.startswith("kueue.x-k8s.io/")} == {
            "kueue.x-k8s.io/queue-name": "gpu", "kueue.x-k8s.io/pod-group-name": "j"}
        assert tmpl["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "4",  # 2 trainer + 2 rollout pods
                                       "kueue.x-k8s.io/pod-group-serving": "true", "kueue.x-k8s.io/role-hash": role}
    # Colocated: the engine is in the trainer pods, the gang is the trainer pods.
    colo = build(job_manifest("j", placement="colocated", trainer={"replicas": 1}, rollout={"replicas": 1},
                              scheduling={"gang": "kueue", "queueName": "gpu"}))
    assert colo[("StatefulSet", "j-trainer")]["spec"]["template"]["metadata"]["annotations"][
        "kueue.x-k8s.io/pod-group-total-count"] == "1"
    # Environments are no members: each of their pods is admitted on its own.
    env = build(job_manifest("j", scheduling={"gang": "kueue", "queueName": "gpu"},
                             environments=[{"name": "calc", "command": ["python", "-m", "calc"]}]))
    env_tmpl = env[("Deployment", "j-env-calc")]["spec"]["template"]["metadata"]
    assert env_tmpl["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
    assert "kueue.x-k8s.io/pod-group-name" not in env_tmpl["labels"] and "annotations" not in env_tmpl

    # Volcano (https://volcano.sh/en/docs/podgroup/): a PodGroup with minMember trainer + rollout
    # pods, before the pods; the group-name annotation and schedulerName on both templates.
    volcano = build(job_manifest("j", scheduling={"gang": "volcano", "queueName": "q"}))
    pg = volcano[("PodGroup", "j")]
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" and pg["spec"] == {"minMember": 4, "queue": "q"}
    assert list(volcano).index(("PodGroup", "j")) < list(volcano).index(("StatefulSet", "j-trainer"))
    for key in (("StatefulSet", "j-trainer"), ("Deployment", "j-rollout")):
        tmpl = volcano[key]["spec"]["template"]
        assert tmpl["spec"]["schedulerName"] == "volcano"
        assert tmpl["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "j"}
    assert not any(k[0] == "PodGroup" for k in build(job_manifest("j")))


@pytest.mark.parametrize("gang", ["none", "volcano"])
def test_rollout_count_never_reaches_the_trainer_template(gang):
    """A StatefulSet rolls its pods when its template changes: scaling the rollouts must not (with
    Kueue the count is the gang's size, in every template: a running job refuses a new one)."""
    def trainer(rollouts):
        kids = build(job_manifest("j", rollout={"replicas": rollouts}, scheduling={"gang": gang, "queueName": "q"}))
        return kids[("StatefulSet", "j-trainer")]
    assert trainer(4) == trainer(2)


def test_scale_and_hash():
    base = build(job_manifest("j"))
    down = build(job_manifest("j"), scale=children.Scale(0, 0))
    assert down[("StatefulSet", "j-trainer")]["spec"]["replicas"] == 0
    assert down[("Deployment", "j-rollout")]["spec"]["replicas"] == 0
    changed = {k for k in base if base[k]["metadata"]["annotations"][n.ANN_HASH]
               != down[k]["metadata"]["annotations"][n.ANN_HASH]}
    assert changed == {("StatefulSet", "j-trainer"), ("Deployment", "j-rollout")}
    again = build(job_manifest("j"))
    assert all(again[k]["metadata"]["annotations"][n.ANN_HASH] == base[k]["metadata"]["annotations"][n.ANN_HASH]
               for k in base)


def test_relative_checkpoint_path_lives_in_the_run_dir_on_a_cluster():
    kids = build(job_manifest("j", checkpoint={"path": "checkpoints"}))
    c = container(kids[("StatefulSet", "j-trainer")])
    assert env_of(c)[plan.ENV_CHECKPOINT_DIR] == "/var/run/grpojob/checkpoints"
    assert "/var/run/grpojob/checkpoints" in {m["mountPath"] for m in c["volumeMounts"]}


def _checkpoint_volume(sts: dict) -> dict | None:
    return next((v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == pods.CHECKPOINTS_VOLUME), None)


def test_checkpoints_default_to_a_claim_per_trainer_pod_that_outlives_suspend():
    """A StatefulSet's claim template (its controller makes <template>-<sts>-<ordinal> per pod and
    adds the volume to the pod), kept on scale-down, deleted with the StatefulSet:
    https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/#persistentvolumeclaim-retention"""
    sts = build(job_manifest("j", checkpoint=PER_POD))[("StatefulSet", "j-trainer")]
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == pods.CHECKPOINTS_VOLUME
    assert template["metadata"]["labels"][n.LABEL_JOB] == "j"
    # no storageClassName: the cluster's default StorageClass provisions it
    assert template["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    assert _checkpoint_volume(sts) is None
    assert {"name": pods.CHECKPOINTS_VOLUME, "mountPath": "/checkpoints"} in container(sts)["volumeMounts"]
    sized = build(job_manifest("j", checkpoint={**PER_POD, "size": "200Gi", "storageClassName": "fast-ssd"}))
    assert sized[("StatefulSet", "j-trainer")]["spec"]["volumeClaimTemplates"][0]["spec"] == {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "200Gi"}}, "storageClassName": "fast-ssd"}
    validate_all([sts, sized[("StatefulSet", "j-trainer")]])


@pytest.mark.parametrize("checkpoint,trainer,volume", [
    ({"volumeClaim": "ckpt"}, {}, {"name": pods.CHECKPOINTS_VOLUME, "persistentVolumeClaim": {"claimName": "ckpt"}}),
    ({**PER_POD, "storage": "ephemeral"}, {}, {"name": pods.CHECKPOINTS_VOLUME, "emptyDir": {}}),
    ({}, {"volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "x"}}],
          "volumeMounts": [{"name": "mine", "mountPath": "/checkpoints"}]}, None)])
def test_other_checkpoint_storage_needs_no_claim_template(checkpoint, trainer, volume):
    sts = build(job_manifest("j", checkpoint=checkpoint, trainer=trainer))[("StatefulSet", "j-trainer")]
    assert "volumeClaimTemplates" not in sts["spec"] and "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    assert _checkpoint_volume(sts) == volume
    at_path = [m["name"] for m in container(sts)["volumeMounts"] if m["mountPath"] == "/checkpoints"]
    assert at_path == [pods.CHECKPOINTS_VOLUME if volume else "mine"]
    validate_all([sts])


def test_checkpoint_weight_sync_needs_a_shared_claim_on_a_cluster():
    job = parse(job_manifest("j", weightSync={"backend": "checkpoint"}, trainer=ONE_POD, checkpoint=PER_POD))
    errors = children.cluster_errors(job)
    assert [e.path for e in errors] == ["spec.checkpoint.volumeClaim"]
    assert "rollout pods read the trainer's checkpoints" in errors[0].message


def test_several_trainer_pods_on_claims_of_their_own_are_allowed_but_not_on_an_emptydir_each():
    """A claim per pod keeps each pod's own ranks' shards (checkpoint/pods.py, issue #56 item 2); an
    emptyDir per pod goes with its pod, and a resume needs every pod's part: refused."""
    assert children.cluster_errors(parse(job_manifest("j", checkpoint=PER_POD))) == []  # persistent: a claim each
    (error,) = children.cluster_errors(parse(job_manifest("j", checkpoint={**PER_POD, "storage": "ephemeral"})))
    assert error.path == "spec.checkpoint.storage", error
    assert error.message.startswith("ephemeral with trainer.replicas 2: each trainer pod keeps its own ranks' shards")
    assert "one lost pod leaves no checkpoint any pod can resume" in error.message
    assert children.cluster_errors(parse(job_manifest("j"))) == []  # one shared claim
    assert children.cluster_errors(parse(job_manifest("j", trainer=ONE_POD, checkpoint={**PER_POD,
                                                                                      "storage": "ephemeral"}))) == []


def test_image_default_and_override(monkeypatch):
    job = parse(job_manifest("j"))
    monkeypatch.delenv(n.IMAGE_ENV, raising=False)
    sts = 5  # after the NetworkPolicies, the ConfigMap and the Services
    assert container(children.build(job, namespace="ml")[sts])["image"] == n.DEFAULT_IMAGE
    assert n.DEFAULT_IMAGE == "ghcr.io/grpojob/runtime:0.1.0"
    monkeypatch.setenv(n.IMAGE_ENV, "mirror.local/grpojob:0.1.0")
    assert container(children.build(job, namespace="ml")[sts])["image"] == "mirror.local/grpojob:0.1.0"
    assert container(children.build(job, namespace="ml", image="x/y:1")[sts])["image"] == "x/y:1"


def test_trainer_pod_runs_exactly_what_grpojob_run_starts_locally(tmp_path):
    """One renderer: the operator's container and `grpojob run`'s local process both come from
    plan.roles; only placement-dependent values (hosts, ports, paths, the replica index) differ."""
    from grpojob.local import runner

    job = parse(job_manifest("j"))
    kids = {children.key(o): o for o in children.build(job, namespace="ml")}
    local = {c.name: c for c in runner._children(job, tmp_path, backend=None)}
    for role, key in (("trainer", ("StatefulSet", "j-trainer")), ("rollout", ("Deployment", "j-rollout"))):
        pod = container(kids[key])
        proc = local[f"{role}-0"]
        assert [os.path.basename(proc.argv[0]), *proc.argv[1:]] == pod["command"]
        pod_env = env_of(pod)
        role_obj = next(r for r in plan.roles(job, children.placement(job, "ml", children.Cluster())) if r.name == role)
        assert set(pod_env) == set(role_obj.env) | set(role_obj.per_replica_env) | set(pods.CACHE_ENV)
        pod_env = {k: v for k, v in pod_env.items() if k not in pods.CACHE_ENV}  # the pod's own writable dirs
        assert set(pod_env) <= set(proc.env)
        placement_dependent = {plan.ENV_CONFIG, plan.ENV_RUN_DIR, plan.ENV_CHECKPOINT_DIR, plan.ENV_SYNC_ADDR,
                               plan.ENV_TOKEN_FILE, plan.ENV_TRAJECTORY_URL,
                               plan.ENV_TRAINER_PORT, plan.ENV_ROLLOUT_PORT, "PET_MASTER_ADDR", "PET_MASTER_PORT",
                               *role_obj.per_replica_env}
        same = {k for k in pod_env if k not in placement_dependent}
        assert same and {k: pod_env[k] for k in same} == {k: proc.env[k] for k in same}
