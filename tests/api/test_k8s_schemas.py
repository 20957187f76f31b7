"""The Kubernetes sub-objects of a spec: the vendored schemas are the official ones, the CRD embeds
them, and the CLI (grpojob.api.check) and the CRD refuse the same bad manifests at the same path."""
from __future__ import annotations

import copy
import json

import celpy
import pytest
import yaml

from grpojob.api import check, k8s
from tests.helpers.k8s_schema import ROOT, crd_errors, crd_schema
from tools import vendor_k8s_schemas

EXAMPLE = yaml.safe_load((ROOT / "examples" / "qwen-gsm8k.yaml").read_text())
TYPED = {"resources": "ResourceRequirements", "env": "EnvVar", "tolerations": "Toleration", "affinity": "Affinity",
         "volumes": "Volume", "volumeMounts": "VolumeMount", "podSecurityContext": "PodSecurityContext",
         "securityContext": "SecurityContext"}


def test_vendored_schemas_are_regenerated_from_kubernetes_validate():
    assert k8s.SCHEMAS_FILE.read_text() == vendor_k8s_schemas.text(), \
        "runtime/grpojob/api/k8s_schemas.json is stale: run `make k8s-schemas`"


def test_vendored_schemas_keep_every_official_field():
    """Nothing of the official definitions is lost on the way to a structural schema."""
    defs = vendor_k8s_schemas.definitions()

    def fields(node, seen=()):
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            if name in (vendor_k8s_schemas.QUANTITY, vendor_k8s_schemas.INT_OR_STRING):
                return {"": "int-or-string"}
            return fields(defs[name], seen + (name,))
        out = {"": node.get("type") if isinstance(node.get("type"), str) else
               [t for t in node.get("type", []) if t != "null"][0]}
        for key, sub in (node.get("properties") or {}).items():
            out.update({f".{key}{k}": v for k, v in fields(sub, seen).items()})
        if "items" in node:
            out.update({f"[]{k}": v for k, v in fields(node["items"], seen).items()})
        return out

    def ours(node):
        out = {"": "int-or-string" if node.get("x-kubernetes-int-or-string") else node["type"]}
        for key, sub in (node.get("properties") or {}).items():
            out.update({f".{key}{k}": v for k, v in ours(sub).items()})
        if "items" in node:
            out.update({f"[]{k}": v for k, v in ours(node["items"]).items()})
        return out

    for name in vendor_k8s_schemas.ROOTS:
        assert ours(k8s.schema(name)) == fields(defs[vendor_k8s_schemas.PREFIX + name]), name


@pytest.mark.parametrize("role", ["trainer", "rollout"])
@pytest.mark.parametrize("field", sorted(TYPED))
def test_the_crd_embeds_the_official_schema(role, field):
    node = crd_schema()["properties"]["spec"]["properties"][role]["properties"][field]
    if node.get("type") == "array":
        node = node["items"]
    want = k8s.strict(k8s.schema(TYPED[field]))
    assert {k: v for k, v in node.items() if k != "description"} == \
        {k: v for k, v in want.items() if k != "description"}


NAMES = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu", "amd.com/gpu",
         "example.com/foo_bar.baz", "cpus", "gpu", "GPU", "kubernetes.io/gpu", "requests.nvidia.com/gpu",
         "nvidia.com/", "/gpu", "Nvidia.com/gpu", "nvidia.com/-gpu", "a/b/c", ""]


def test_the_crd_rule_and_its_python_twin_agree_on_resource_names():
    (rule,) = k8s.vendored()["definitions"]["ResourceRequirements"]["properties"]["requests"]["x-kubernetes-validations"]
    env = celpy.Environment()
    program = env.program(env.compile(rule["rule"]))
    for name in NAMES:
        cel = bool(program.evaluate({"self": celpy.json_to_cel({name: 1})}))
        assert cel == k8s.valid_resource_name(name), name
    assert [n for n in NAMES if k8s.valid_resource_name(n)] == NAMES[:7]


def mutate(path: str, value, key: str = ""):
    """Set the field at a dotted path (list indexes as numbers; `key` for a last key with dots)."""
    def apply(doc):
        keys = path.split(".") + ([key] if key else [])
        node = doc
        for k in keys[:-1]:
            node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
        node[keys[-1]] = value
    return apply


T = "spec.trainer"
R = "spec.rollout"
# Mutation classes of the cluster example: (mutation, the path the CLI names).
MUTATIONS = [
    (mutate(f"{T}.tolerations.0.key", {"a": 1}), f"{T}.tolerations[0].key"),
    (mutate(f"{T}.tolerations.0.tolerationSeconds", "forever"), f"{T}.tolerations[0].tolerationSeconds"),
    (mutate(f"{T}.tolerations.0.effekt", "NoSchedule"), f"{T}.tolerations[0].effekt"),
    (mutate(f"{T}.tolerations", {"key": "x"}), f"{T}.tolerations"),
    (mutate(f"{T}.resources.requests.cpus", 4), f"{T}.resources.requests[cpus]"),
    (mutate(f"{T}.resources.requests.gpu", 1), f"{T}.resources.requests[gpu]"),
    (mutate(f"{T}.resources.limits", "eight", "nvidia.com/gpu"), f"{T}.resources.limits[nvidia.com/gpu]"),
    (mutate(f"{T}.resources.limits", 8.5, "nvidia.com/gpu"), f"{T}.resources.limits[nvidia.com/gpu]"),
    (mutate(f"{T}.resources.limit", {"cpu": 1}), f"{T}.resources.limit"),
    (mutate(f"{R}.resources.requests.memory", "128 GB"), f"{R}.resources.requests[memory]"),
    (mutate(f"{R}.resources", ["cpu"]), f"{R}.resources"),
    (mutate(f"{T}.affinity", {"nodeAffinity": []}), f"{T}.affinity.nodeAffinity"),
    (mutate(f"{T}.affinity", {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": "high", "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}),
     f"{T}.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    (mutate(f"{T}.affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu"}]}]}}}),
     f"{T}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
     ".matchExpressions[0].operator"),
    (mutate(f"{T}.affinity", {"nodeAfinity": {}}), f"{T}.affinity.nodeAfinity"),
    (mutate(f"{T}.env", [{"name": "TOKEN", "valueFrom": {"secretRef": {"name": "hf"}}}]),
     f"{T}.env[0].valueFrom.secretRef"),
    (mutate(f"{T}.env", [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf"}}}]),
     f"{T}.env[0].valueFrom.secretKeyRef.key"),
    (mutate(f"{T}.env", [{"value": "x"}]), f"{T}.env[0].name"),
    (mutate(f"{T}.env", [{"name": "N", "value": 3}]), f"{T}.env[0].value"),
    (mutate(f"{T}.volumes", [{"name": "data", "nfs": {"server": "nas"}}]), f"{T}.volumes[0].nfs.path"),
    (mutate(f"{T}.volumes", [{"name": "data", "persistentVolumeClaim": {"claim": "x"}}]),
     f"{T}.volumes[0].persistentVolumeClaim.claim"),
    (mutate(f"{T}.volumes", [{"emptyDir": {}}]), f"{T}.volumes[0].name"),
    (mutate(f"{T}.volumes", [{"name": "s", "emptyDir": {"sizeLimit": "lots"}}]), f"{T}.volumes[0].emptyDir.sizeLimit"),
    (mutate(f"{T}.volumeMounts", [{"name": "x"}]), f"{T}.volumeMounts[0].mountPath"),
    (mutate(f"{T}.securityContext", {"runAsUser": "root"}), f"{T}.securityContext.runAsUser"),
    (mutate(f"{T}.securityContext", {"capabilities": {"drop": "ALL"}}), f"{T}.securityContext.capabilities.drop"),
    (mutate(f"{T}.securityContext", {"priviledged": True}), f"{T}.securityContext.priviledged"),
    (mutate(f"{R}.podSecurityContext", {"seccompProfile": {}}), f"{R}.podSecurityContext.seccompProfile.type"),
    (mutate(f"{R}.podSecurityContext", {"fsGroup": "users"}), f"{R}.podSecurityContext.fsGroup"),
    (mutate(f"{T}.nodeSelector", {"gpu": 8}), f"{T}.nodeSelector[gpu]"),
    (mutate("spec.algorithm.name", "ppo-fancy"), "spec.algorithm.name"),
    (mutate("spec.rollout.workflow", "multi turn"), "spec.rollout.workflow"),
    (mutate("spec.rewards.0.name", "exact"), "spec.rewards[0].name"),
    (mutate("spec.algorithm.groupSize", 1), "spec.algorithm.groupSize"),
    (mutate("spec.rollout.replicas", "4"), "spec.rollout.replicas"),
]


@pytest.mark.parametrize("change, path", MUTATIONS, ids=[p for _, p in MUTATIONS])
def test_the_cli_and_the_crd_refuse_each_mutation_at_its_path(change, path):
    doc = copy.deepcopy(EXAMPLE)
    change(doc)
    job, errors = check(doc)
    assert job is None and path in [e.path for e in errors], [str(e) for e in errors]
    crd = crd_errors(doc)
    # The API server names a CEL rule's field (the map) and a quantity's key alike.
    assert any(path == p or path.startswith(p + "[") for p in crd), f"the CRD missed {path}: {crd}"


def test_the_example_and_its_valid_variants_pass_both():
    doc = copy.deepcopy(EXAMPLE)
    t = doc["spec"]["trainer"]
    t["resources"]["requests"].update({"ephemeral-storage": "100Gi", "hugepages-2Mi": "1Gi", "cpu": 0})
    # hugepages cannot be overcommitted: the API server wants a limit equal to the request
    t["resources"]["limits"]["hugepages-2Mi"] = "1024Mi"
    t["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token", "optional": None}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    t["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"grpojob.io/job": "x"}}}]}}
    t["volumes"] = [{"name": "hf", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
                        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}}}}}]
    t["volumeMounts"] = [{"name": "hf", "mountPath": "/home/grpojob/.cache/huggingface"},
                         {"name": "scratch", "mountPath": "/scratch"}]
    t["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}
    job, errors = check(doc)
    assert errors == [] and crd_errors(doc) == []
    # Nulls are pruned, as the API server prunes them.
    assert job.spec.trainer.env[0]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}


def test_volume_names_and_mounts_are_consistent():
    doc = copy.deepcopy(EXAMPLE)
    doc["spec"]["rollout"]["volumes"] = [{"name": "grpojob-home", "emptyDir": {}}, {"name": "a", "emptyDir": {}},
                                         {"name": "a", "emptyDir": {}}]
    doc["spec"]["rollout"]["volumeMounts"] = [{"name": "b", "mountPath": "/b"}]
    _, errors = check(doc)
    assert [str(e) for e in errors][0].startswith("spec.rollout.volumes[0].name: 'grpojob-home': names starting with")
    doc["spec"]["rollout"]["volumes"] = [{"name": "a", "emptyDir": {}}]
    _, errors = check(doc)
    assert [str(e) for e in errors] == ["spec.rollout.volumeMounts[0].name: 'b' names no entry of volumes"]


def test_the_core_package_reads_the_vendored_file_not_kubernetes_validate():
    source = (ROOT / "runtime" / "grpojob" / "api" / "k8s.py").read_text()
    assert "kubernetes_validate" not in source
    data = json.loads(k8s.SCHEMAS_FILE.read_text())
    assert data["kubernetesVersion"] == vendor_k8s_schemas.K8S_VERSION
    assert set(data["definitions"]) == set(vendor_k8s_schemas.ROOTS)


def test_vendored_descriptions_keep_their_first_sentence_and_a_deprecation():
    """The CRD must fit a client-side `kubectl apply` (test_crd.py): descriptions are cut."""
    summary = vendor_k8s_schemas.summary
    assert summary("pool is the rados pool name. Default is rbd. More info: https://examples.k8s.io/x") == \
        "pool is the rados pool name."
    assert summary("gitRepo represents a git repository. Deprecated: GitRepo is deprecated. Use an init container.") \
        == "gitRepo represents a git repository. Deprecated."
    assert summary('type for HostPath Volume Defaults to "" More info: https://kubernetes.io/docs/x') == \
        'type for HostPath Volume Defaults to ""'
    assert summary("weight associated with matching the corresponding nodeSelectorTerm, in the range 1-100.") == \
        "weight associated with matching the corresponding nodeSelectorTerm, in the range 1-100."
