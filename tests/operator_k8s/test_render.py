"""`grpojob render FILE`: the operator's children as a YAML stream, valid for kubectl apply."""
from __future__ import annotations

import base64
import os
import subprocess
import sys

import yaml

from grpojob import auth

from tests.helpers.k8s_schema import ROOT, validate_all


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpojob", "render", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_render_prints_valid_children_with_overrides():
    out = render("examples/qwen-gsm8k.yaml", "--set", "rollout.replicas=6", "--image", "my/runtime:9")
    assert out.returncode == 0, out.stderr
    objs = list(yaml.safe_load_all(out.stdout))
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("NetworkPolicy", "qwen-gsm8k-trainer"),
        ("NetworkPolicy", "qwen-gsm8k-rollout"), ("ConfigMap", "qwen-gsm8k-config"),
        ("Service", "qwen-gsm8k-trainer"), ("Service", "qwen-gsm8k-rollout"),
        ("StatefulSet", "qwen-gsm8k-trainer"), ("Deployment", "qwen-gsm8k-rollout"), ("PodMonitor", "qwen-gsm8k")]
    assert all(o["metadata"]["namespace"] == "ml" and "ownerReferences" not in o["metadata"] for o in objs)
    deploy = objs[6]
    assert deploy["spec"]["replicas"] == 6
    assert deploy["spec"]["template"]["spec"]["containers"][0]["image"] == "my/runtime:9"
    assert validate_all(objs) == 7
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


def token_volumes(objs: list[dict]) -> set[tuple[str, str]]:
    """(Secret, key) every pod template mounts as the job's token (all its keys: no items)."""
    out = set()
    for o in objs:
        for v in ((o.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes", []):
            if "secret" in v:
                assert "items" not in v["secret"]
                out.add((v["secret"]["secretName"], auth.TOKEN_KEY))
    return out


def test_render_for_gitops_holds_no_secret_and_its_header_makes_the_one_the_pods_mount(tmp_path):
    """Issue 31: the rendered Secret was immutable with no data, so pods got no token. Now no
    Secret is rendered (no secret in git); the header's one command makes the Secret every pod
    mounts (run here through the real kubectl, --dry-run=client: no API server needed)."""
    out = render("examples/tiny-local.yaml", "--namespace", "ml")
    assert out.returncode == 0, out.stderr
    objs = [o for o in yaml.safe_load_all(out.stdout) if o]
    assert not [o for o in objs if o["kind"] == "Secret"]
    assert "the pods need Secret ml/tiny-local-token" in out.stderr
    (command,) = [line[3:].strip() for line in out.stdout.splitlines() if line.startswith("#   kubectl ")]
    made = subprocess.run(["bash", "-c", command + " --dry-run=client -o yaml"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "KUBECONFIG": os.devnull})
    assert made.returncode == 0, made.stderr
    secret = yaml.safe_load(made.stdout)
    assert (secret["metadata"]["namespace"], secret["metadata"]["name"]) == ("ml", "tiny-local-token")
    assert token_volumes(objs) == {(secret["metadata"]["name"], k) for k in secret["data"]}
    assert len(base64.b64decode(base64.b64decode(secret["data"][auth.TOKEN_KEY]))) == 32


def test_render_with_token_applies_as_it_is():
    out = render("examples/tiny-local.yaml", "--namespace", "ml", "--token")
    assert out.returncode == 0, out.stderr
    objs = [o for o in yaml.safe_load_all(out.stdout) if o]
    secret = objs[0]
    assert secret["kind"] == "Secret" and secret["immutable"] is True
    token = base64.b64decode(secret["data"][auth.TOKEN_KEY]).decode()
    assert len(token) >= 40 and token_volumes(objs) == {(secret["metadata"]["name"], auth.TOKEN_KEY)}
    assert "keep it out of git" in secret["metadata"]["annotations"]["grpojob.io/token"]
    assert "keep it out of git" in out.stderr
    assert validate_all(objs) == len(objs)
    again = yaml.safe_load(next(iter(render("examples/tiny-local.yaml", "--token").stdout.split("---"))))
    assert again["data"][auth.TOKEN_KEY] != secret["data"][auth.TOKEN_KEY]  # a fresh token each time
