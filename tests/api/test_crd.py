"""The committed CRD is exactly what the models generate, is a valid CRD, and accepts the examples."""
from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest
import yaml

from grpojob.api.crd import crd, crd_yaml
from tests.helpers.k8s_schema import ROOT, crd_schema, validate_builtin, validate_grpojob

CRD_FILE = ROOT / "crds" / "grpojob.yaml"


def test_committed_crd_is_generated():
    assert CRD_FILE.read_text() == crd_yaml(), "crds/grpojob.yaml is stale: run `grpojob crd -o crds/grpojob.yaml`"


def test_cli_prints_the_same_crd():
    out = subprocess.run([sys.executable, "-m", "grpojob", "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == CRD_FILE.read_text()


def test_crd_passes_strict_kubernetes_validation():
    validate_builtin(yaml.safe_load(CRD_FILE.read_text()))


def _walk(node, path="spec"):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, dict) and items.get("properties"):  # lists of free-form objects need none
        yield from _walk(items, f"{path}[]")


def test_every_field_is_described_and_structural():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema["properties"]["spec"]):
        assert node.get("description"), f"{path} has no description (kubectl explain would be empty)"
        assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node, path
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), f"{path} has no type"


def test_crd_shape():
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    cols = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Phase", "Step", "Reward", "Age"]
    assert crd()["spec"]["names"]["shortNames"] == ["grpo"]
    algo = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["algorithm"]
    assert algo["properties"]["groupSize"]["minimum"] == 2
    assert algo["properties"]["lossAggregation"]["enum"] == ["token-mean", "seq-mean-token-mean",
                                                            "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_the_crd_schema(path):
    validate_grpojob(yaml.safe_load(path.read_text()))


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
