"""spec.placement colocated on a cluster: the rollout server is a second container of the one
trainer pod (sharing its /dev/shm and network namespace), and no rollout Deployment or Service is
rendered. PodSecurity restricted and kubernetes-validate --strict run over these children through
test_children.VARIANTS["colocated"]; this file checks what is particular to them."""
from __future__ import annotations

import copy

from grpojob import plan
from grpojob.api import check, parse
from grpojob_operator import children
from tests.helpers.k8s_schema import validate_all
from tests.helpers.pod_security import restricted

from .conftest import job_manifest
from .test_children import OWNER, VARIANTS, env_of


def colocated(**overrides) -> dict:
    """The tests' job with placement colocated: one trainer pod, one engine."""
    trainer, rollout = overrides.pop("trainer", {}), overrides.pop("rollout", {})
    return job_manifest("j", placement="colocated", trainer={"replicas": 1, **trainer},
                        rollout={"replicas": 1, **rollout}, **overrides)


def _kids(manifest: dict) -> list[dict]:
    return children.build(parse(manifest), namespace="ml", owner=OWNER)


def test_colocated_renders_no_rollout_workload_and_one_pod_with_both_containers():
    objs = _kids(colocated())
    assert [children.key(o) for o in objs] == [
        ("NetworkPolicy", "j-trainer"), ("NetworkPolicy", "j-rollout"),
        ("ConfigMap", "j-config"), ("Service", "j-trainer"), ("StatefulSet", "j-trainer")]
    sts = objs[-1]
    assert sts["spec"]["replicas"] == 1
    pod = sts["spec"]["template"]["spec"]
    trainer, engine = pod["containers"]
    assert (trainer["name"], engine["name"]) == ("trainer", "rollout")
    assert engine["command"] == plan.rollout_command()
    env = env_of(engine)
    # The trainer reaches its engine on loopback; nothing outside the pod does (no port, no Service).
    assert env[plan.ENV_ADVERTISE_HOST] == "127.0.0.1" and engine["ports"] == []
    assert env[plan.ENV_ROLE] == "rollout" and env[plan.ENV_SYNC_ADDR] == env_of(trainer)[plan.ENV_SYNC_ADDR]
    # Both mount the pod's one /dev/shm, an emptyDir in memory: the weight push goes through it.
    shm = {v["name"]: v for v in pod["volumes"]}["grpojob-shm"]
    assert shm["emptyDir"] == {"medium": "Memory"}
    for c in (trainer, engine):
        assert {"name": "grpojob-shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert restricted(pod) == []
    assert validate_all(objs) == len(objs)


def test_colocated_counts_only_trainer_pods_in_the_gang():
    objs = {children.key(o): o for o in _kids(copy.deepcopy(VARIANTS["colocated"]))}
    assert objs[("PodGroup", "j")]["spec"]["minMember"] == 1
    assert ("Deployment", "j-rollout") not in objs and ("Service", "j-rollout") not in objs


def test_the_same_manifest_renders_the_same_processes_for_grpojob_run():
    """The plan gives both places one trainer and one engine with the same commands."""
    job = parse(colocated())
    where = plan.Placement(trainer_host="127.0.0.1", config_path="c", checkpoint_dir="k", run_dir="r",
                           token_file="t")
    trainer, rollout = plan.roles(job, where)
    assert rollout.pod_of == "trainer" and rollout.replicas == trainer.replicas == 1
    assert rollout.env[plan.ENV_ADVERTISE_HOST] == "127.0.0.1"


def test_colocated_contradictions_are_refused_with_their_field_paths():
    cases = {
        "spec.trainer.replicas": dict(trainer={"replicas": 2}),
        "spec.rollout.replicas": dict(rollout={"replicas": 2}),
        "spec.weightSync.backend": dict(weightSync={"backend": "nccl"}),
        "spec.rollout.port": dict(trainer={"port": 9400}, rollout={"port": 9400}),
        "spec.rollout.tensorParallelSize": dict(rollout={"tensorParallelSize": 4}),
    }
    for path, overrides in cases.items():
        job, errors = check(colocated(**overrides))
        # every error is reported (nccl is also refused for the hf engine, at the same path)
        assert job is None and {e.path for e in errors} == {path}, (path, errors)
        assert "colocated" in errors[0].message
    _, errors = check(colocated(weightSync={"backend": "gloo"}))
    assert "shm on CPU, cuda-ipc on GPU" in errors[0].message
    _, errors = check(job_manifest("j", placement="together"))
    assert errors[0].path == "spec.placement" and "colocated" in errors[0].message


def test_a_colocated_pods_engine_container_is_not_the_trainer():
    """The kubelet's view of a colocated trainer pod: the engine container's restarts and exits are
    not the trainer's (backoffLimit counts the trainer's), and its engine failure is reported."""
    from grpojob.api import plugins
    from grpojob_operator import names as n
    from grpojob_operator.views import pod_view

    meta = {"name": "j-trainer-0", "namespace": "ml", "labels": {n.LABEL_JOB: "j", n.LABEL_ROLE: "trainer"}}
    broken = plugins.failure_message(plugins.ENGINE_FAILED, ["rollout server j-trainer-0: CUDA out of memory"])
    status = {"phase": "Running", "containerStatuses": [
        {"name": "rollout", "restartCount": 3, "ready": True,
         "lastState": {"terminated": {"exitCode": 1, "message": broken}}},
        {"name": "trainer", "restartCount": 0, "ready": True, "lastState": {}}]}
    _, view = pod_view(meta, status)
    assert view.restarts == 0 and not view.clean_exit
    assert view.engine_failure == "rollout server j-trainer-0: CUDA out of memory"


GPU = {"limits": {"nvidia.com/gpu": 1}}


def test_on_gpus_the_trainer_and_its_engine_share_one_container():
    """Kubernetes device plugins give a device to the one container whose resources.limits name it
    (https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/): an
    engine in a second container would not see the trainer's GPU. With GPUs the pod has one
    container, `grpojob colocated-pod`, which runs both processes; the engine's command and its own
    environment (the plan's, then the user's spec.rollout.env) travel as JSON."""
    import json

    m = colocated(trainer={"resources": GPU}, rollout={"env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]})
    objs = _kids(m)
    assert children.cluster_errors(parse(m)) == []
    pod = objs[-1]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["name"] == "trainer" and c["command"] == plan.colocated_pod_command()
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    env = env_of(c)
    assert env[plan.ENV_ROLE] == "trainer" and "PET_NODE_RANK" in env
    engine = json.loads(env[plan.ENV_COLOCATED_ENGINE])
    assert engine["command"] == plan.rollout_command()
    assert engine["env"][plan.ENV_ROLE] == "rollout" and engine["env"][plan.ENV_ADVERTISE_HOST] == "127.0.0.1"
    assert engine["env"]["VLLM_LOGGING_LEVEL"] == "DEBUG" and "VLLM_LOGGING_LEVEL" not in env
    assert plan.ENV_SYNC_ADDR not in engine["env"]  # the same as the trainer's: the container's
    assert plan.ENV_REPLICA_ID in env  # the engine's name in logs: the pod's, from the downward API
    assert restricted(pod) == []
    assert validate_all(objs) == len(objs)


def test_on_gpus_what_spec_rollout_says_about_its_own_container_is_refused():
    """One container has one image, one set of resources and one security context: the operator
    says where to put them (an InvalidSpec condition and Event with these paths)."""
    m = colocated(trainer={"resources": GPU}, rollout={
        "image": "other:1", "resources": {"requests": {"cpu": "2"}}, "securityContext": {"runAsUser": 5},
        "env": [{"name": "A", "value": "1"},
                {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})
    errors = children.cluster_errors(parse(m))
    assert [e.path for e in errors] == ["spec.rollout.image", "spec.rollout.resources",
                                        "spec.rollout.securityContext", "spec.rollout.env[1].valueFrom"]
    assert all("trainer's container" in e.message for e in errors)
    # Without GPUs the engine keeps a container of its own, with all of these.
    assert children.cluster_errors(parse(colocated(rollout={"image": "other:1"}))) == []
