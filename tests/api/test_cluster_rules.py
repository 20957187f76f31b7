"""`grpojob validate` means what the Kubernetes API server accepts (issue 31): a manifest with many
problems gets every one of them, each with its field path, in ONE run. The rules themselves are
unit-tested in test_cluster_rules_units.py; the CRD's CEL twins are checked against them here."""
from __future__ import annotations

import copy
import json
import struct
import textwrap

import celpy
import pytest
import yaml

from grpojob.api import cluster_rules, k8s, names
from grpojob.api.validate import check
from tests.helpers.k8s_schema import crd_errors
from tools import vendor_k8s_schemas as vendor

from .test_cli import grpojob
from .test_spec import MINIMAL

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
PREF = "preferredDuringSchedulingIgnoredDuringExecution"
TERM = f"spec.trainer.affinity.nodeAffinity.{REQ}.nodeSelectorTerms[0]"

# One manifest, every field-level rule broken once (the issue's list), and where each is reported.
BROKEN = {
    "model": {"path": "/models/m", "volumeClaim": "Models_PVC", "lora": {"targetModules": ["lm_head"]}},
    "dataset": {"factory": "toy", "args": {"noSuchField": 1, "size": "x"}},
    "evaluation": {"dataset": {"factory": "countdown", "args": {"count": 2.5}}},
    "rewards": [{"name": "toy"}],
    "trainer": {
        "port": 80,
        "tolerations": [{"key": "gpu", "operator": "Bogus", "effect": "Whatever"}],
        "resources": {"requests": {"memory": "2Gi", "cpu": "500m", "nvidia.com/gpu": 1},
                      "limits": {"memory": "1Gi", "cpu": "0.5"}},
        "affinity": {
            "nodeAffinity": {REQ: {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In"},
                {"key": "gpu", "operator": "Exists", "values": ["a100"]},
                {"key": "mem", "operator": "Gt", "values": ["lots"]},
                {"key": "mem", "operator": "Lt", "values": ["1", "2"]}]}]}},
            "podAntiAffinity": {PREF: [{"weight": 100, "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn"},
                                                       {"key": "app", "operator": "DoesNotExist",
                                                        "values": ["x"]}]}}}]}},
        "labels": {"bad key!": "x", "team": "-ml-"},
        "annotations": {"example.com/ok": "yes", "/no-prefix": "x"},
        "nodeSelector": {"pool": "GPU pool"},
        "serviceAccountName": "Trainer_SA",
        "priorityClassName": "High",
    },
    "rollout": {"port": 70000, "tolerations": [{"operator": "Equal", "value": "x", "effect": "NoSchedule"}],
                "resources": {"requests": {"memory": "1024Mi"}, "limits": {"memory": "1Gi"}}},
    "checkpoint": {"volumeClaim": "ckpt.", "storageClassName": "Fast_SSD"},
    "code": {"configMap": "My Code"},
    "scheduling": {"gang": "kueue", "queueName": "Q"},
}
EXPECTED = [
    "spec.model.volumeClaim", "spec.model.lora.targetModules[0]",
    "spec.dataset.args.noSuchField", "spec.dataset.args.size", "spec.evaluation.dataset.args.count",
    "spec.trainer.port", "spec.rollout.port",
    "spec.trainer.tolerations[0].operator", "spec.trainer.tolerations[0].effect",
    "spec.rollout.tolerations[0].operator",
    "spec.trainer.resources.requests[memory]", "spec.trainer.resources.limits[nvidia.com/gpu]",
    f"{TERM}.matchExpressions[0].values", f"{TERM}.matchExpressions[1].values",
    f"{TERM}.matchExpressions[2].values[0]", f"{TERM}.matchExpressions[3].values",
    f"spec.trainer.affinity.podAntiAffinity.{PREF}[0].podAffinityTerm.labelSelector.matchExpressions[0].values",
    f"spec.trainer.affinity.podAntiAffinity.{PREF}[0].podAffinityTerm.labelSelector.matchExpressions[1].values",
    "spec.trainer.labels[bad key!]", "spec.trainer.labels[team]", "spec.trainer.annotations[/no-prefix]",
    "spec.trainer.nodeSelector[pool]", "spec.trainer.serviceAccountName", "spec.trainer.priorityClassName",
    "spec.checkpoint.volumeClaim", "spec.checkpoint.storageClassName", "spec.code.configMap",
    "spec.scheduling.queueName",
]
# Valid look-alikes that must not be reported: 500m == 0.5 cpu, 1024Mi == 1Gi, an annotation key
# with a prefix.
NOT_EXPECTED = ["spec.trainer.resources.requests[cpu]", "spec.rollout.resources", "spec.trainer.annotations[example"]


def manifest(spec: dict) -> dict:
    return {**copy.deepcopy(MINIMAL), "spec": copy.deepcopy(spec)}


def lines(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines()[1:]]


def test_one_run_of_validate_lists_every_cluster_rule_with_its_path(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(manifest(BROKEN), sort_keys=False))
    r = grpojob("validate", str(tmp_path / "bad.yaml"), "--no-resolve")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    paths = [line.split(": ", 1)[0] for line in lines(r.stderr)]
    assert [p for p in EXPECTED if p not in paths] == [], r.stderr
    assert not [p for p in paths for bad in NOT_EXPECTED if p.startswith(bad)], r.stderr
    said = "\n".join(lines(r.stderr))
    assert "spec.trainer.resources.requests[memory]: 2Gi must be less than or equal to the memory limit of 1Gi" in said
    assert "spec.trainer.tolerations[0].operator: 'Bogus' is not supported: use Equal or Exists" in said
    assert "spec.trainer.tolerations[0].effect: 'Whatever' is not supported" in said
    assert "spec.model.lora.targetModules[0]: the output layer (lm_head) cannot take an adapter" in said
    assert "spec.dataset.args.noSuchField: unknown argument: the built-in dataset toy takes categories, size, seed" \
        in said
    assert "spec.dataset.args.size: must be an integer" in said


def test_every_cross_field_rule_is_reported_in_one_run(tmp_path):
    spec = copy.deepcopy(MINIMAL["spec"])
    spec.update({"placement": "colocated", "trainer": {"replicas": 2}, "rollout": {"replicas": 2},
                 "weightSync": {"backend": "gloo"}, "algorithm": {"partialRollouts": True},
                 "training": {"microBatchTokens": 16}})
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec)))
    r = grpojob("validate", str(tmp_path / "x.yaml"), "--no-resolve")
    assert r.returncode == 1
    paths = [line.split(": ", 1)[0] for line in lines(r.stderr)]
    assert paths == ["spec.trainer.replicas", "spec.rollout.replicas", "spec.weightSync.backend",
                     "spec.training.microBatchTokens", "spec.algorithm.partialRollouts"], r.stderr


def test_cluster_rules_and_cross_field_rules_are_reported_together(tmp_path):
    """The local rules (pod validation, names, a sub-model's own rules) stand aside in a second
    validation so that the spec's cross-field rules run on the same values: one run, both kinds."""
    spec = copy.deepcopy(BROKEN)
    del spec["trainer"]["port"], spec["rollout"]["port"]  # out-of-range ports are schema errors
    spec.update({"placement": "colocated", "weightSync": {"backend": "gloo"}})
    spec["trainer"]["replicas"] = 2
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec)))
    r = grpojob("validate", str(tmp_path / "x.yaml"), "--no-resolve")
    paths = [line.split(": ", 1)[0] for line in lines(r.stderr)]
    want = [p for p in EXPECTED if not p.endswith(".port")] + ["spec.trainer.replicas", "spec.weightSync.backend"]
    assert r.returncode == 1 and sorted(paths) == sorted(want), r.stderr
    # A schema error (a type) leaves values the cross-field rules cannot read: only field errors then.
    spec["training"] = {"steps": "many"}
    _, errors = check(manifest(spec))
    assert "spec.training.steps" in [e.path for e in errors]
    assert "spec.trainer.replicas" not in [e.path for e in errors]


def test_the_trainer_port_cannot_be_a_port_trainer_pod_0_already_uses(tmp_path):
    spec = {**copy.deepcopy(MINIMAL["spec"]), "trainer": {"port": 29500}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec)))
    r = grpojob("validate", str(tmp_path / "x.yaml"), "--no-resolve")
    assert r.returncode == 1 and "spec.trainer.port: 29500 is also the rendezvous port" in r.stderr


USER_DATA = '''
def rows(n: int, prefix: str = "q"):
    return [{"prompt": f"{prefix}{i}"} for i in range(n)]

class Rows:
    def __init__(self, n: int, *, shuffle: bool = False):
        self.n = n

    def setup(self, spec, tokenizer):
        pass

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return "q"

    def reference_answer(self, i):
        return None
'''


def test_plug_in_dataset_args_are_bound_to_the_signature_when_validate_imports_it(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "user_data.py").write_text(textwrap.dedent(USER_DATA))
    spec = copy.deepcopy(MINIMAL["spec"])
    spec.update({"code": {"localPath": str(tmp_path / "code")},
                 "dataset": {"factory": "user_data:rows", "args": {"prefix": 3, "limit": 1}},
                 "evaluation": {"dataset": {"class": "user_data:Rows", "args": {"shuffle": "yes"}}}})
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec), sort_keys=False))
    r = grpojob("validate", str(tmp_path / "x.yaml"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    said = lines(r.stderr)
    assert said == [
        "spec.dataset.args.prefix: must be a string (as 'user_data:rows' annotates it), not 3",
        "spec.dataset.args.limit: unknown argument: 'user_data:rows' takes n, prefix",
        "spec.dataset.args: missing required argument 'n' of 'user_data:rows'",
        "spec.evaluation.dataset.args.shuffle: must be true or false (as 'user_data:Rows' annotates it), not 'yes'",
        "spec.evaluation.dataset.args: missing required argument 'n' of 'user_data:Rows'",
    ], r.stderr
    spec["dataset"]["args"] = {"n": 4}
    spec["evaluation"]["dataset"]["args"] = {"n": 2, "shuffle": True}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec)))
    r = grpojob("validate", str(tmp_path / "x.yaml"))
    assert r.returncode == 0, r.stderr


def write_safetensors(path, tensors: dict[str, list[int]]) -> None:
    """A safetensors file of zeros (float32) with these shapes, written by hand (no torch)."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_lora_targets_are_checked_against_a_local_checkpoints_layers(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    write_safetensors(model / "model.safetensors", {
        "model.embed_tokens.weight": [8, 4], "model.layers.0.self_attn.q_proj.weight": [4, 4],
        "model.layers.0.self_attn.q_proj.bias": [4], "model.layers.0.mlp.down_proj.weight": [4, 4],
        "model.layers.0.input_layernorm.weight": [4], "lm_head.weight": [8, 4]})
    spec = {**copy.deepcopy(MINIMAL["spec"]), "model": {"path": str(model), "lora": {
        "targetModules": ["q_proj", "self_attn.q_proj", "qproj", "input_layernorm", "mlp.q_proj"]}}}
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest(spec)))
    r = grpojob("validate", str(tmp_path / "x.yaml"))
    assert r.returncode == 1
    layers = "down_proj, embed_tokens, lm_head, q_proj"
    assert lines(r.stderr) == [
        f"spec.model.lora.targetModules[{i}]: '{name}' matches no linear layer of the model (its layers: {layers})"
        for i, name in ((2, "qproj"), (3, "input_layernorm"), (4, "mlp.q_proj"))], r.stderr
    # all-linear, or a model elsewhere (a claim, a hub name): nothing to read, nothing refused
    for model_spec in ({"path": str(model), "lora": {}}, {"path": str(model), "volumeClaim": "models",
                                                          "lora": {"targetModules": ["qproj"]}}):
        (tmp_path / "x.yaml").write_text(yaml.safe_dump(manifest({**spec, "model": model_spec})))
        assert grpojob("validate", str(tmp_path / "x.yaml")).returncode == 0


def test_the_example_manifests_stay_valid_for_both_the_validator_and_the_crd():
    from tests.helpers.k8s_schema import ROOT

    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict) or doc.get("kind") != "GRPOJob":
            continue
        job, errors = check(doc)
        assert errors == [], (path.name, [str(e) for e in errors])
        assert crd_errors(doc) == [], path.name


# -- the CRD's CEL rules agree with the Python rules --------------------------------------------

_CEL = celpy.Environment()


def cel_ok(rules: list[dict], value: dict) -> bool:
    return all(bool(_CEL.program(_CEL.compile(r["rule"])).evaluate({"self": celpy.json_to_cel(value)}))
               for r in rules)


TOLERATIONS = [
    {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists"},
    {"key": "gpu", "value": "a100"}, {"key": "gpu", "operator": "Equal", "value": "a100", "effect": ""},
    {"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "gpu", "operator": "Bogus"}, {"key": "gpu", "effect": "Whatever"}, {"operator": "Equal"}, {},
    {"key": "gpu", "operator": "Exists", "value": "a100"}, {"key": "gpu", "tolerationSeconds": 30},
    {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30}, {"key": "", "operator": "Exists", "value": ""},
]
NODE_REQUIREMENTS = [
    {"key": "a", "operator": op, **({"values": v} if v is not None else {})}
    for op in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Near")
    for v in (None, [], ["1"], ["1", "2"], ["x"])
]


@pytest.mark.parametrize("value", TOLERATIONS, ids=[json.dumps(t) for t in TOLERATIONS])
def test_the_toleration_cel_rules_and_the_python_rule_agree(value):
    assert cel_ok(vendor.TOLERATION_RULES, value) == (cluster_rules.toleration(value) == [])


@pytest.mark.parametrize("value", NODE_REQUIREMENTS, ids=[json.dumps(r) for r in NODE_REQUIREMENTS])
def test_the_selector_cel_rules_and_the_python_rules_agree(value):
    assert cel_ok(vendor.NODE_SELECTOR_RULES, value) == (cluster_rules.node_selector_requirement(value) == [])
    assert cel_ok(vendor.LABEL_SELECTOR_RULES, value) == (cluster_rules.label_selector_requirement(value) == [])


FIELD_REQUIREMENTS = [{"key": k, "operator": op, "values": v} for k in ("metadata.name",)
                      for op in ("In", "NotIn", "Exists") for v in ([], ["node-1"], ["a", "b"])]


@pytest.mark.parametrize("value", FIELD_REQUIREMENTS, ids=[json.dumps(r) for r in FIELD_REQUIREMENTS])
def test_the_node_field_selector_rule_agrees(value):
    ok = cel_ok(vendor.NODE_FIELD_SELECTOR_RULES, value)
    assert ok == (cluster_rules.node_field_selector_requirement(value) == [])


KEYS = ["app", "example.com/role", "a.b-c_d", "A", "x" * 63, "x" * 64, "example.com/" + "y" * 63, "bad key",
        "-app", "app-", "Example.com/x", "/x", "a/b/c", "example.com/", ".", "a..b/x", "kubernetes.io/hostname"]


def test_the_label_and_annotation_key_rules_agree_with_the_python_rules():
    for key in KEYS:
        assert cel_ok([{"rule": names.LABEL_KEYS_RULE}], {key: "v"}) == (names.qualified_name(key) == []), key
        assert cel_ok([{"rule": names.ANNOTATION_KEYS_RULE}], {key: "v"}) == \
            (names.qualified_name(key.lower()) == []), key


def test_the_crd_refuses_what_the_issue_listed():
    """The API server refuses at `kubectl apply` what its CEL and schema can say (requests <= limits
    and the key syntax of selectors are left to the validator: see tools/vendor_k8s_schemas.py)."""
    refused = crd_errors(manifest(BROKEN))
    for path in ("spec.trainer.tolerations[0]", "spec.rollout.tolerations[0]", f"{TERM}.matchExpressions[0]",
                 f"{TERM}.matchExpressions[1]", f"{TERM}.matchExpressions[2]", f"{TERM}.matchExpressions[3]",
                 "spec.trainer.labels", "spec.trainer.annotations", "spec.trainer.nodeSelector[pool]",
                 "spec.trainer.serviceAccountName", "spec.trainer.priorityClassName", "spec.model.volumeClaim",
                 "spec.checkpoint.volumeClaim", "spec.code.configMap", "spec.trainer.port", "spec.rollout.port"):
        assert path in refused, (path, refused)


def test_the_vendored_cel_rules_carry_no_python_twin_of_their_own():
    """k8s.py checks the resource-name rule with the schema; every other rule of the vendored
    schemas is acted out by cluster_rules (its Python rule runs once the schema passes)."""
    assert set(k8s.rule_checks()) == {vendor.RESOURCE_NAME_RULE}
    assert set(cluster_rules.RULES) <= set(vendor.ROOTS)
