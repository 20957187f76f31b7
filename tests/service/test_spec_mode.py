"""spec.mode: service needs no dataset or rewards and takes no environments; train keeps needing
both (the model validator and the CRD's own rules, acted out, agree); the client imports no torch."""
from __future__ import annotations

import subprocess
import sys

import pytest

from grpojob.api import check, load_file
from tests.helpers.k8s_schema import ROOT, crd_errors, validate_grpojob

EXAMPLE = ROOT / "examples" / "plugins" / "nexrl-remote" / "nexrl-remote.yaml"
SERVICE = {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "svc"},
           "spec": {"mode": "service", "model": {"path": "/models/m"}}}


def test_a_service_job_needs_no_dataset_or_rewards():
    job, errors = check(SERVICE)
    assert errors == [] and job.spec.mode == "service" and job.spec.dataset is None and job.spec.rewards == []
    validate_grpojob(SERVICE)
    job, errors = check(load_file(EXAMPLE))
    assert errors == [] and job.spec.mode == "service"
    validate_grpojob(load_file(EXAMPLE))


@pytest.mark.parametrize("spec, path, words", [
    ({"mode": "service", "environments": [{"name": "a", "command": ["x"]}]}, "spec.environments",
     "mode service runs no training loop"),
    ({"mode": "train"}, "spec.dataset", "required unless rollout.workflow is none"),
    ({"mode": "serve"}, "spec.mode", "'train' or 'service'"),
])
def test_bad_mode_specs_name_the_field(spec, path, words):
    bad = {**SERVICE, "spec": {"model": {"path": "/models/m"}, **spec}}
    job, errors = check(bad)
    assert job is None and path in [e.path for e in errors], [str(e) for e in errors]
    assert words in next(e.message for e in errors if e.path == path)
    assert crd_errors(bad), "the API server refuses it too"


def test_the_client_imports_no_torch():
    code = ("import sys, grpojob.client; "
            "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
