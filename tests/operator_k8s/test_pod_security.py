"""Trainer and rollout pods pass PodSecurity `restricted` (acted out by tests/helpers/pod_security.py:
no API server runs here), run with a read-only root filesystem, and can still write wherever the
runtime writes. The spec can override all of it."""
from __future__ import annotations

import copy
from pathlib import PurePosixPath

import pytest

from grpojob import plan
from grpojob.api import parse
from grpojob_operator import children, pods
from grpojob_operator import names as n
from tests.helpers.pod_security import restricted

from .conftest import job_manifest
from .test_children import VARIANTS

def templates(manifest: dict) -> dict[str, dict]:
    """trainer|rollout -> pod spec of its workload."""
    kids = children.build(parse(manifest), namespace="ml")
    return {o["spec"]["template"]["metadata"]["labels"][n.LABEL_ROLE]: o["spec"]["template"]["spec"]
            for o in kids if o["kind"] in ("StatefulSet", "Deployment")}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_pods_pass_the_restricted_profile(variant):
    for name, pod in templates(copy.deepcopy(VARIANTS[variant])).items():
        assert restricted(pod) == [], name


def test_the_acted_out_checker_refuses_what_restricted_refuses():
    pod = templates(job_manifest("j"))["trainer"]
    bad = copy.deepcopy(pod)
    c = bad["containers"][0]
    c["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    bad["securityContext"] = {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}
    bad["hostNetwork"] = True
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    found = " | ".join(restricted(bad))
    for rule in ("privileged", "non-default capabilities", "hostPath volumes", "host namespaces",
                 "allowPrivilegeEscalation != false", "runAsNonRoot != true", "runAsUser=0", "seccompProfile",
                 "unrestricted capabilities", "restricted volume types"):
        assert rule in found, rule


def _writable(container: dict, pod: dict) -> list[str]:
    read_only_volumes = {v["name"] for v in pod["volumes"]
                         if "configMap" in v or (v.get("persistentVolumeClaim") or {}).get("readOnly")}
    return [m["mountPath"] for m in container["volumeMounts"]
            if not m.get("readOnly") and m["name"] not in read_only_volumes]


def _under(path: str, roots: list[str]) -> bool:
    return any(PurePosixPath(path) == PurePosixPath(r) or PurePosixPath(r) in PurePosixPath(path).parents
               for r in roots)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_place_the_runtime_writes_is_a_writable_volume(variant):
    for name, pod in templates(copy.deepcopy(VARIANTS[variant])).items():
        c = pod["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        env = {e["name"]: e.get("value") for e in c["env"]}
        writable = _writable(c, pod)
        paths = {k: env[k] for k in pods.CACHE_ENV} | {plan.ENV_RUN_DIR: env[plan.ENV_RUN_DIR]}
        # the trainer writes checkpoints (rollouts only read them); into a volume unless they go to an
        # object store (the qwen example: s3://), which is no place on the pod's filesystem
        if name == "trainer" and "://" not in env[plan.ENV_CHECKPOINT_DIR]:
            paths[plan.ENV_CHECKPOINT_DIR] = env[plan.ENV_CHECKPOINT_DIR]
        for key, path in paths.items():
            assert _under(path, writable), f"{name}: {key}={path} is on the read-only root ({writable})"
        assert {n.TMP_DIR, n.SHM_DIR, n.HOME_DIR} <= set(writable)


def test_the_spec_overrides_security_and_scratch_volumes():
    m = job_manifest("j", trainer={
        "podSecurityContext": {"runAsUser": 2000, "fsGroup": 3000},
        "securityContext": {"readOnlyRootFilesystem": False, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}},
        "volumes": [{"name": "hf", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                    {"name": "scratch", "emptyDir": {"sizeLimit": "200Gi"}}],
        "volumeMounts": [{"name": "hf", "mountPath": "/home/grpojob"}, {"name": "scratch", "mountPath": "/tmp"}]})
    pod = templates(m)["trainer"]
    assert pod["securityContext"] == {**pods.POD_SECURITY, "runAsUser": 2000, "fsGroup": 3000}
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[n.HOME_DIR] == "hf" and mounts[n.TMP_DIR] == "scratch"
    names = [v["name"] for v in pod["volumes"]]
    assert "grpojob-home" not in names and "grpojob-tmp" not in names and {"hf", "scratch"} <= set(names)
    assert "IPC_LOCK" in " ".join(restricted(pod))  # a user's choice the restricted profile refuses
    # The rollout keeps its defaults.
    assert restricted(templates(m)["rollout"]) == []


def test_a_user_variable_overrides_a_cache_location():
    m = job_manifest("j", rollout={"env": [{"name": "HF_HOME", "value": "/models/hf"}]})
    env = {e["name"]: e.get("value") for e in templates(m)["rollout"]["containers"][0]["env"]}
    assert env["HF_HOME"] == "/models/hf" and env["HOME"] == n.HOME_DIR
