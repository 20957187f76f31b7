"""spec.placement colocated: the API server's CEL rules (in the CRD) and the model validator agree
on the contradictions both refuse, and the validator names each field it refuses."""
from __future__ import annotations

import celpy
import pytest

from grpojob.api import check
from grpojob.api.colocation import CEL

BASE = {"model": {"path": "m"}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}]}
CASES = [
    ({}, None),
    ({"placement": "separate", "trainer": {"replicas": 3}, "weightSync": {"backend": "nccl"}}, None),
    ({"placement": "colocated"}, None),
    ({"placement": "colocated", "trainer": {"replicas": 1}, "rollout": {"replicas": 1},
      "weightSync": {"backend": "cuda-ipc"}}, None),
    ({"placement": "colocated", "weightSync": {"backend": "shm"}}, None),
    ({"placement": "colocated", "trainer": {"replicas": 2}}, "spec.trainer.replicas"),
    ({"placement": "colocated", "rollout": {"replicas": 3}}, "spec.rollout.replicas"),
    ({"placement": "colocated", "weightSync": {"backend": "gloo"}}, "spec.weightSync.backend"),
    ({"placement": "colocated", "weightSync": {"backend": "checkpoint"}}, "spec.weightSync.backend"),
]


@pytest.mark.parametrize("spec, refused_at", CASES)
def test_cel_rules_and_the_validator_agree(spec, refused_at):
    env = celpy.Environment()
    doc = {**BASE, **spec}
    cel_ok = all(bool(env.program(env.compile(r["rule"])).evaluate({"self": celpy.json_to_cel(doc)})) for r in CEL)
    job, errors = check({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "c"},
                         "spec": doc})
    assert cel_ok == (refused_at is None)
    assert [e.path for e in errors] == ([] if refused_at is None else [refused_at])


def test_every_colocated_refusal_names_its_field():
    colocated = {**BASE, "placement": "colocated"}
    cases = {
        "spec.environments": {"environments": [{"name": "e", "command": ["x"]}]},
        "spec.mode": {"mode": "service"},
        "spec.rollout.port": {"rollout": {"port": 29600}},
        "spec.rollout.tensorParallelSize": {"rollout": {"tensorParallelSize": 2}},
        "spec.rollout.resources": {"rollout": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
    }
    for path, extra in cases.items():
        _, errors = check({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "c"},
                           "spec": {**colocated, **extra}})
        assert [e.path for e in errors] == [path], (path, errors)
        assert "colocated" in errors[0].message
