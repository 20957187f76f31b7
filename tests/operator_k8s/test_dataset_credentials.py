"""spec.dataset.credentialsSecret on a cluster (docs/data.md): the Secret's keys become variables of
the trainer container only (envFrom), never of the rollout servers; every manifest stays valid."""
from __future__ import annotations

from grpojob.api import parse
from grpojob_operator import children
from tests.helpers.k8s_schema import validate_all

from .conftest import job_manifest

OWNER = children.owner_reference("j", "0f6c2c35-2d1b-4ad0-9d43-0a1b2c3d4e5f")


def _containers(objs, kind):
    return [c for o in objs if o["kind"] == kind for c in o["spec"]["template"]["spec"]["containers"]]


def test_the_dataset_secrets_reach_the_trainer_container_only():
    doc = job_manifest("j")
    doc["spec"]["dataset"] = {"path": "s3://bucket/train.parquet", "credentialsSecret": "s3-reader",
                              "maxPromptLength": 64}
    doc["spec"]["evaluation"] = {"dataset": {"path": "gs://other/test.jsonl", "credentialsSecret": "gcs-reader",
                                                 "maxPromptLength": 64}}
    objs = children.build(parse(doc), namespace="ml", owner=OWNER)
    [trainer] = _containers(objs, "StatefulSet")
    assert trainer["envFrom"] == [{"secretRef": {"name": "s3-reader"}}, {"secretRef": {"name": "gcs-reader"}}]
    assert all("envFrom" not in c for c in _containers(objs, "Deployment"))
    validate_all(objs)
    # the same Secret for both: named once; none: no envFrom at all
    doc["spec"]["evaluation"]["dataset"]["credentialsSecret"] = "s3-reader"
    [trainer] = _containers(children.build(parse(doc), namespace="ml", owner=OWNER), "StatefulSet")
    assert trainer["envFrom"] == [{"secretRef": {"name": "s3-reader"}}]
    [plain] = _containers(children.build(parse(job_manifest("j")), namespace="ml", owner=OWNER), "StatefulSet")
    assert "envFrom" not in plain


def test_render_says_which_dataset_secrets_the_pods_need():
    import yaml

    from grpojob_operator import render

    doc = job_manifest("j")
    doc["spec"]["dataset"] = {"path": "s3://bucket/train.parquet", "credentialsSecret": "s3-reader",
                              "maxPromptLength": 64}
    for token in (False, True):
        out = render.render(doc, "ml", token=token)
        assert "# The trainer pods read Secret ml/s3-reader (spec.dataset.credentialsSecret" in out
        assert not any(o["kind"] == "Secret" and o["metadata"]["name"] == "s3-reader" for o in yaml.safe_load_all(out))
    assert "credentialsSecret" not in render.render(job_manifest("j"), "ml")


def test_a_job_without_a_dataset_renders_without_secrets():
    doc = job_manifest("j")
    doc["spec"].pop("dataset")
    doc["spec"]["rollout"] = {**doc["spec"].get("rollout", {}), "workflow": "none"}
    doc["spec"]["environments"] = [{"name": "env", "command": ["python", "-m", "env"]}]
    doc["spec"]["training"]["microBatchTokens"] = 1024  # the default maxPromptLength stands without a dataset
    objs = children.build(parse(doc), namespace="ml", owner=OWNER)
    assert all("envFrom" not in c for c in _containers(objs, "StatefulSet"))


def test_the_air_gapped_example_gives_its_pods_the_environment_docs_data_md_names():
    """examples/air-gapped-s3.yaml (docs/data.md, "Air-gapped clusters"): the Hub switched off in
    the trainer and rollout pods, the in-cluster store's plain-http endpoint and the credentials'
    Secret on the trainer only, and HF_HOME (where object copies are cached) on the pod's own volume."""
    from pathlib import Path

    from grpojob.api import load_file
    from grpojob_operator.pods import CACHE_ENV

    job = parse(load_file(Path(__file__).resolve().parents[2] / "examples" / "air-gapped-s3.yaml"))
    objs = children.build(job, namespace="ml", owner=OWNER)
    [trainer] = _containers(objs, "StatefulSet")
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["AWS_ENDPOINT_URL"] == "http://minio.storage.svc.cluster.local:9000" and "AWS_ALLOW_HTTP" not in env
    assert env["HF_HOME"] == CACHE_ENV["HF_HOME"]
    assert trainer["envFrom"] == [{"secretRef": {"name": "minio-reader"}}]
    rollouts = _containers(objs, "Deployment")
    assert rollouts and all({"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"] for c in rollouts)
    assert all("envFrom" not in c and not any(e["name"].startswith("AWS_") for e in c["env"]) for c in rollouts)
    validate_all(objs)
