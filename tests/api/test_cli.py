"""The CLI as a user meets it: exit codes and messages with field paths, no tracebacks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BAD = """apiVersion: grpojob.io/v1alpha1
kind: GRPOJob
metadata: {name: bad}
spec:
  model: {path: /nonexistent}
  dataset: {factory: toy}
  rewards: [{name: toy}]
  algorithm: {groupSize: 1, lossAggregation: mean}
"""


def grpojob(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "grpojob", *args], capture_output=True, text=True, cwd=cwd)


def test_validate_ok_prints_a_summary():
    r = grpojob("validate", str(ROOT / "examples" / "tiny-local.yaml"))
    assert r.returncode == 0 and "valid GRPOJob 'tiny-local'" in r.stdout


def test_validate_lists_every_error_with_its_path(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD)
    r = grpojob("validate", str(tmp_path / "bad.yaml"))
    assert r.returncode == 1
    assert "spec.algorithm.groupSize: must be >= 2" in r.stderr
    assert "spec.algorithm.lossAggregation: must be one of" in r.stderr
    assert "Traceback" not in r.stderr


def test_set_overrides_are_validated_too():
    r = grpojob("validate", str(ROOT / "examples" / "tiny-local.yaml"), "--set", "training.steps=0")
    assert r.returncode == 1 and "spec.training.steps: must be >= 1" in r.stderr
    r = grpojob("validate", str(ROOT / "examples" / "tiny-local.yaml"), "--set", "training.steps")
    assert r.returncode == 1 and "KEY=VALUE" in r.stderr


def test_not_yaml_and_missing_file(tmp_path):
    (tmp_path / "x.yaml").write_text("spec: [unclosed")
    r = grpojob("validate", str(tmp_path / "x.yaml"))
    assert r.returncode == 1 and "not valid YAML" in r.stderr and "Traceback" not in r.stderr
    r = grpojob("validate", str(tmp_path / "missing.yaml"))
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_run_refuses_an_invalid_manifest_before_starting_anything(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD)
    r = grpojob("run", str(tmp_path / "bad.yaml"), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 1 and "spec.algorithm.groupSize" in r.stderr
    assert not (tmp_path / "run").exists()


def test_run_without_model_says_which_field(tmp_path):
    r = grpojob("run", str(ROOT / "examples" / "tiny-local.yaml"), "--set", "metadata.annotations={}",
                "--set", "model.path=nothing-here", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 1 and "spec.model.path" in r.stderr and "Traceback" not in r.stderr


def test_validate_names_the_field_inside_a_kubernetes_object(tmp_path):
    doc = (ROOT / "examples" / "qwen-gsm8k.yaml").read_text().replace(
        "- {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}",
        "- {key: {name: nvidia.com/gpu}, operator: Exists, effect: NoSchedule}")
    (tmp_path / "bad.yaml").write_text(doc.replace("requests: {cpu: \"32\"", "requests: {cpus: \"32\""))
    r = grpojob("validate", str(tmp_path / "bad.yaml"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "spec.trainer.tolerations[0].key: must be a string" in r.stderr
    assert "spec.trainer.resources.requests[cpus]: not a valid name" in r.stderr


def test_checkpoint_storage_choices_are_checked_and_ephemeral_warns():
    tiny = str(ROOT / "examples" / "tiny-local.yaml")
    r = grpojob("validate", tiny, "--set", "checkpoint.storage=ephemeral")
    assert r.returncode == 0 and "valid GRPOJob" in r.stdout
    assert "warning: spec.checkpoint.storage: ephemeral: checkpoints live in an emptyDir" in r.stderr
    assert "refuses to suspend" in r.stderr
    assert "warning" not in grpojob("validate", tiny).stderr  # the default (a claim per trainer pod) is quiet
    # Several trainer pods: a claim per pod keeps each pod's own shards; an emptyDir per pod goes with
    # its pod and a resume needs every pod's: refused before any pod starts.
    r = grpojob("validate", tiny, "--set", "trainer.replicas=2")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    r = grpojob("validate", tiny, "--set", "trainer.replicas=2", "--set", "checkpoint.storage=ephemeral")
    assert r.returncode == 1 and "spec.checkpoint.storage: ephemeral with trainer.replicas 2" in r.stderr, r.stderr
    r = grpojob("validate", tiny, "--set", "trainer.replicas=2", "--set", "checkpoint.volumeClaim=ckpt")
    assert r.returncode == 0 and "warning" not in r.stderr
    # an object store is one place for every trainer pod; another URL is refused, not taken as a
    # directory (it became a local folder named "s3:")
    r = grpojob("validate", tiny, "--set", "trainer.replicas=2", "--set", "checkpoint.path=s3://ckpt/run1",
                "--set", "checkpoint.credentialsSecret=ckpt-s3")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    r = grpojob("validate", tiny, "--set", "checkpoint.path=ftp://ckpt/run1")
    assert r.returncode == 1 and "spec.checkpoint.path: 'ftp://' is not a store checkpoints are written to" \
        in r.stderr, r.stderr
    for bad, path, said in (({"checkpoint.path": "s3://"}, "path", "names no valid bucket"),
                            ({"checkpoint.credentialsSecret": "x"}, "credentialsSecret", "is for an object-store path"),
                            ({"checkpoint.path": "gs://b/p", "checkpoint.volumeClaim": "c"}, "volumeClaim",
                             "mounts a directory, but path gs://b/p is an object store"),
                            ({"checkpoint.path": "az://c/p", "weightSync.backend": "checkpoint"}, None,
                             "spec.weightSync.backend: checkpoint: rollout servers read the weights")):
        r = grpojob("validate", tiny, *[x for k, v in bad.items() for x in ("--set", f"{k}={v}")])
        where = f"spec.checkpoint.{path}: " if path else ""
        assert r.returncode == 1 and f"{where}" in r.stderr and said in r.stderr, r.stderr
    r = grpojob("validate", tiny, "--set", "checkpoint.storage=ephemeral", "--set", "checkpoint.volumeClaim=ckpt")
    assert r.returncode == 1 and "spec.checkpoint.storage: ephemeral contradicts volumeClaim" in r.stderr
    r = grpojob("validate", tiny, "--set", "checkpoint.size=lots")
    assert r.returncode == 1 and "spec.checkpoint.size: must be a quantity such as 8, 500m or 16Gi" in r.stderr
    r = grpojob("validate", tiny, "--set", "checkpoint.storageClassName=Fast_SSD")
    assert r.returncode == 1 and "spec.checkpoint.storageClassName: must be a DNS-1123 subdomain" in r.stderr


def test_version_prints_the_package_version_and_the_crd_versions_served():
    from grpojob import __version__
    from grpojob.api import API_VERSION

    for argv in (["version"], ["--version"]):
        r = grpojob(*argv)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"grpojob {__version__}", f"CRD versions served: {API_VERSION}"]
