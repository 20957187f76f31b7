"""spec.environments and rollout.workflow none: what validates, what is refused with which field
path (the model validator and the CRD's own rules, acted out, agree), and the example."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from grpojob.api import check, load_file
from grpojob.api.crd import crd
from tests.helpers.k8s_schema import ROOT, crd_errors, validate_grpojob

EXAMPLE = ROOT / "examples" / "environments" / "arithmetic.yaml"
ENVS_ONLY = {
    "apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "envs"},
    "spec": {"model": {"path": "/models/m"}, "rollout": {"workflow": "none"},
             "environments": [{"name": "arith", "command": ["python", "env.py"]}]},
}


def doc(**spec):
    out = copy.deepcopy(ENVS_ONLY)
    out["spec"].update(spec)
    return out


def test_an_environments_only_job_needs_no_dataset_or_rewards():
    job, errors = check(ENVS_ONLY)
    assert errors == [] and job.spec.dataset is None and job.spec.rewards == []
    env = job.spec.environments[0]
    assert (env.replicas, env.image, env.env) == (1, None, [])
    assert job.spec.max_prompt_length == 512  # the context the rollout servers size themselves for
    validate_grpojob(ENVS_ONLY)
    job, errors = check(load_file(EXAMPLE))
    assert errors == [] and job.spec.rollout.workflow == "none" and job.spec.environments[0].name == "arithmetic"
    validate_grpojob(load_file(EXAMPLE))


@pytest.mark.parametrize("spec, path, words", [
    ({"rollout": {}}, "spec.dataset", "required unless rollout.workflow is none"),
    ({"rollout": {}, "dataset": {"factory": "toy"}}, "spec.rewards", "at least 1 reward is required"),
    ({"environments": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]},
     "spec.environments[1].name", "'a' is used twice"),
    ({"environments": [{"name": "Arith", "command": ["x"]}]}, "spec.environments[0].name", "must match"),
    ({"environments": [{"name": "a" * 21, "command": ["x"]}]}, "spec.environments[0].name", "at most 20"),
    ({"environments": [{"name": "a", "command": []}]}, "spec.environments[0].command", "at least 1"),
    ({"environments": [{"name": "a"}]}, "spec.environments[0].command", "required"),
    ({"environments": [{"name": "a", "command": ["x"], "replicas": 0}]}, "spec.environments[0].replicas", ">= 1"),
    ({"environments": [{"name": "a", "command": ["x"], "volumes": []}]}, "spec.environments[0].volumes",
     "unknown field"),
    ({"environments": [{"name": "a", "command": ["x"], "env": [{"value": "1"}]}]},
     "spec.environments[0].env[0].name", "required"),
    ({"rollout": {"workflow": "nothing"}}, "spec.rollout.workflow", "none or 'module:attr'"),
    # The bound that keeps the CRD's rules within the API server's cost budget (test_crd_cost.py).
    ({"environments": [{"name": f"e{i}", "command": ["x"]} for i in range(33)]}, "spec.environments",
     "at most 32 items"),
])
def test_bad_environment_specs_name_the_field(spec, path, words):
    bad = doc(**spec)
    job, errors = check(bad)
    assert job is None and path in [e.path for e in errors], [str(e) for e in errors]
    assert words in next(e.message for e in errors if e.path == path)
    if "used twice" in words:  # the API server's list-map rule (not in the acted-out validator)
        environments = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "properties"]["environments"]
        assert environments["x-kubernetes-list-type"] == "map"
        assert environments["x-kubernetes-list-map-keys"] == ["name"] and "name" in environments["items"]["required"]
    else:
        assert crd_errors(bad), "the API server refuses it too"


def test_grpojob_validate_and_render_take_the_example():
    out = subprocess.run([sys.executable, "-m", "grpojob", "validate", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "grpojob", "render", str(EXAMPLE)], capture_output=True, text=True)
    assert out.returncode == 0 and "name: arithmetic-env-arithmetic" in out.stdout, out.stderr
