"""The committed CRD is exactly what the models generate, is a valid CRD, and accepts the examples."""
from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest
import yaml

from grpojob.api import k8s
from grpojob.api.crd import crd, crd_yaml
from tools.vendor_k8s_schemas import DESCRIPTION_DEPTH
from tests.helpers.crd_limits import ANNOTATIONS_LIMIT, LAST_APPLIED, last_applied_bytes
from tests.helpers.k8s_schema import ROOT, crd_schema, validate_builtin, validate_grpojob

CRD_FILE = ROOT / "crds" / "grpojob.yaml"


def test_committed_crd_is_generated():
    assert CRD_FILE.read_text() == crd_yaml(), "crds/grpojob.yaml is stale: run `grpojob crd -o crds/grpojob.yaml`"


def test_cli_prints_the_same_crd():
    out = subprocess.run([sys.executable, "-m", "grpojob", "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == CRD_FILE.read_text()


def test_crd_passes_strict_kubernetes_validation():
    validate_builtin(yaml.safe_load(CRD_FILE.read_text()))


def _walk(node, path="spec", depth=None):
    """(path, node, depth below the embedding Kubernetes object or None) of every schema node."""
    yield path, node, depth
    for name, child in (node.get("properties") or {}).items():
        inner = depth + 1 if depth is not None else (0 if k8s.MARKER in _PYDANTIC.get(f"{path}.{name}", {}) else None)
        yield from _walk(child, f"{path}.{name}", inner)
    for key, mark in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            inner = depth if depth is not None else (0 if k8s.MARKER in _PYDANTIC.get(f"{path}{mark}", {}) else None)
            yield from _walk(node[key], f"{path}{mark}", inner)


def _pydantic_nodes():
    """Pydantic's own JSON schema by path, to tell our fields from embedded Kubernetes objects."""
    from grpojob.api.spec import GRPOJobSpec

    raw = GRPOJobSpec.model_json_schema(by_alias=True)
    defs = raw.pop("$defs")
    out = {}

    def walk(node, path):
        if "$ref" in node:
            node = defs[node["$ref"].split("/")[-1]]
        for branch in node.get("anyOf", []):
            if branch.get("type") != "null":
                walk(branch, path)
        out.setdefault(path, node)
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
    walk(raw, "spec")
    return out


_PYDANTIC = _pydantic_nodes()
STRUCTURAL_FORBIDDEN = {"$ref", "anyOf", "oneOf", "allOf", "not", "definitions", "patternProperties",
                        "additionalItems", "dependencies", "uniqueItems", "$schema", "id", "title"}


def test_every_field_is_described_and_structural():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    embedded = 0
    for path, node, depth in _walk(schema["properties"]["spec"]):
        a_field = not path.endswith(("[]", "{}"))  # list items and map values are described by their field
        if a_field and (depth is None or depth <= DESCRIPTION_DEPTH):
            assert node.get("description"), f"{path} has no description (kubectl explain would be empty)"
        embedded += depth == 0
        assert not STRUCTURAL_FORBIDDEN & set(node), f"{path}: {STRUCTURAL_FORBIDDEN & set(node)}"
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
    assert embedded == 2 * 8 + 3 + 1, "each workload embeds eight Kubernetes objects, an environment three, " \
        "spec.code its volume"


def test_unknown_fields_are_kept_only_where_kubernetes_keeps_them_or_for_plugin_arguments():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    kept = {p for p, node, _ in _walk(schema["properties"]["spec"]) if node.get("x-kubernetes-preserve-unknown-fields")}
    assert kept == {"spec.dataset.args", "spec.evaluation.dataset.args", "spec.rewards[].args", "spec.trainer.args",
                    "spec.rollout.engineArgs",
                    "spec.code.volume.ephemeral.volumeClaimTemplate.metadata.managedFields[].fieldsV1"} | {
        f"spec.{role}.volumes[].ephemeral.volumeClaimTemplate.metadata.managedFields[].fieldsV1"
        for role in ("trainer", "rollout")}


def test_the_crd_fits_a_client_side_kubectl_apply_with_a_quarter_to_spare():
    """A client-side `kubectl apply` keeps the whole object in its last-applied-configuration
    annotation, and an object's annotations may total 256 KiB (docs/real-cluster-rules.md). The
    chart's copy is the same file (tests/chart)."""
    for obj in (crd(), yaml.safe_load(CRD_FILE.read_text())):
        assert last_applied_bytes(obj) <= 0.75 * ANNOTATIONS_LIMIT
    # The measure is the one kubectl's encoder gives: Go escapes <, > and & in six bytes.
    assert last_applied_bytes({"a": "<&>"}) == len(LAST_APPLIED) + len('{"a":"\\u003c\\u0026\\u003e"}') + 1


def test_crd_shape():
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    cols = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Phase", "Step", "Reward", "Age", "Message"]  # Message: why a job waits or failed
    wide = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority")}
    assert wide["Lag"] == ".status.progress.rollouts[*].lag"  # each rollout server's policy lag
    assert wide["Sync"] == ".status.progress.weightSyncBackend"
    assert wide["Eval"] == ".status.progress.evaluation.rewardMean"  # the last evaluation (spec.evaluation)
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["progress"]["properties"]
    assert {"lag", "replica", "version"} <= set(status["rollouts"]["items"]["properties"])
    assert crd()["spec"]["names"]["shortNames"] == ["grpo"]
    algo = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["algorithm"]
    assert algo["properties"]["groupSize"]["minimum"] == 2
    assert algo["properties"]["lossAggregation"]["enum"] == ["token-mean", "seq-mean-token-mean",
                                                            "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "kind: GRPOJob" in p.read_text()),
                         ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_examples_pass_the_crd_schema(path, committed_schema):
    validate_grpojob(yaml.safe_load(path.read_text()), committed_schema)


@pytest.fixture(scope="module")
def committed_schema():
    """crds/grpojob.yaml's schema, read once (the file is about 250 KB of YAML)."""
    return crd_schema()


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["algorithm"].update(groupSize=1),
    lambda d: d["spec"]["algorithm"].update(unknownField=True),
    lambda d: d["spec"]["rollout"].update(backend="sglang"),
    lambda d: d["spec"].pop("model"),
    lambda d: d["spec"]["training"].update(steps="many"),
])
def test_crd_schema_rejects_what_the_model_rejects(mutate):
    doc = yaml.safe_load((ROOT / "examples" / "qwen-gsm8k.yaml").read_text())
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate_grpojob(doc, crd_schema())
