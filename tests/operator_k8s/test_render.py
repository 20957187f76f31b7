"""`grpojob render FILE`: the operator's children as a YAML stream, valid for kubectl apply."""
from __future__ import annotations

import subprocess
import sys

import yaml

from tests.helpers.k8s_schema import ROOT, validate_all


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpojob", "render", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_render_prints_valid_children_with_overrides():
    out = render("examples/qwen-gsm8k.yaml", "--set", "rollout.replicas=6", "--image", "my/runtime:9")
    assert out.returncode == 0, out.stderr
    objs = list(yaml.safe_load_all(out.stdout))
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("Secret", "qwen-gsm8k-token"), ("NetworkPolicy", "qwen-gsm8k-trainer"),
        ("NetworkPolicy", "qwen-gsm8k-rollout"), ("ConfigMap", "qwen-gsm8k-config"),
        ("Service", "qwen-gsm8k-trainer"), ("Service", "qwen-gsm8k-rollout"),
        ("StatefulSet", "qwen-gsm8k-trainer"), ("Deployment", "qwen-gsm8k-rollout"), ("PodMonitor", "qwen-gsm8k")]
    assert all(o["metadata"]["namespace"] == "ml" and "ownerReferences" not in o["metadata"] for o in objs)
    deploy = objs[7]
    assert deploy["spec"]["replicas"] == 6
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == "my/runtime:9"
    assert validate_all(objs) == 8
    # The Secret comes without a token, and says where it comes from.
    secret = objs[0]
    assert "data" not in secret and "stringData" not in secret and secret["immutable"] is True
    assert "made by the operator" in secret["metadata"]["annotations"]["grpojob.io/token"]
    other = render("examples/qwen-gsm8k.yaml", "--namespace", "research")
    assert {o["metadata"]["namespace"] for o in yaml.safe_load_all(other.stdout)} == {"research"}


def test_render_reports_bad_specs_with_field_paths(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples" / "tiny-local.yaml").read_text())
    out = render(str(bad), "--set", "trainer.replicas=0", "--set", "weightSync.backend=checkpoint")
    assert out.returncode == 1
    assert "spec.trainer.replicas: must be >= 1" in out.stderr and "Traceback" not in out.stderr
    out = render(str(bad), "--set", "weightSync.backend=checkpoint")
    assert out.returncode == 1 and "spec.checkpoint.volumeClaim: required when weightSync.backend" in out.stderr
