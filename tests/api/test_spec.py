"""The GRPOJob API: examples validate, bad manifests fail with the right field path, random specs
never crash the validator, and the spec module stays free of torch."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpojob.api import check, load_file, parse, set_path
from grpojob.api.spec import GRPOJob

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = {
    "apiVersion": "grpojob.io/v1alpha1",
    "kind": "GRPOJob",
    "metadata": {"name": "mini"},
    "spec": {
        "model": {"path": "/models/m"},
        "dataset": {"path": "train.jsonl"},
        "rewards": [{"name": "math_exact"}],
    },
}


def with_(path: str, value, *more):
    """MINIMAL with fields set: with_(path, value, path2, value2, ...)."""
    doc = copy.deepcopy(MINIMAL)
    pairs = [path, value, *more]
    for k, v in zip(pairs[::2], pairs[1::2]):
        set_path(doc, k, v)
    return doc


def without(path: str):
    doc = copy.deepcopy(MINIMAL)
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[p]
    del node[last]
    return doc


def test_minimal_manifest_gets_defaults():
    job = parse(MINIMAL)
    assert job.spec.algorithm.name == "grpo" and job.spec.algorithm.group_size == 8
    assert job.spec.rollout.backend == "vllm" and job.spec.trainer.replicas == 1
    assert job.spec.weight_sync.backend == "auto"
    assert job.dump()["spec"]["algorithm"]["groupSize"] == 8  # manifest form is camelCase


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path):
    job, errors = check(load_file(path), resolve_plugins=True)
    assert errors == [] and job is not None


INVALID = [
    # (manifest, expected path, expected words in the message)
    (with_("algorithm.groupSize", 1), "spec.algorithm.groupSize", "must be >= 2"),
    (with_("algorithm.groupSize", "eight"), "spec.algorithm.groupSize", "integer"),
    (with_("algorithm.lossAggregation", "mean"), "spec.algorithm.lossAggregation", "one of"),
    (with_("algorithm.klEstimator", "k4"), "spec.algorithm.klEstimator", "one of"),
    (with_("algorithm.klBeta", -0.1), "spec.algorithm.klBeta", ">= 0"),
    (with_("algorithm.clipEpsLow", 2), "spec.algorithm.clipEpsLow", "<= 1"),
    (with_("algorithm.importanceCap", 0.5), "spec.algorithm.importanceCap", ">= 1"),
    (with_("algorithm.name", "ppo2"), "spec.algorithm.name", "unknown algorithm"),
    (with_("algorithm.name", "my-mod:Algo"), "spec.algorithm.name", "module:attr"),
    (with_("algorithm.overlong.mode", "cut"), "spec.algorithm.overlong.mode", "one of"),
    (with_("algorithm.extra", 1), "spec.algorithm.extra", "unknown field"),
    (with_("training.steps", 0), "spec.training.steps", ">= 1"),
    (with_("training.learningRate", 0), "spec.training.learningRate", "> 0"),
    (with_("training.lrSchedule", "step"), "spec.training.lrSchedule", "one of"),
    (with_("training.seed", 1.5), "spec.training.seed", "integer"),
    (with_("training.microBatchTokens", 64), "spec.training.microBatchTokens", "whole sequence"),
    # Cross-field rules report the field that must change.
    (with_("algorithm.partialRollouts", True), "spec.algorithm.partialRollouts", "maxStaleness >= 1"),
    (with_("trainer.replicas", 0), "spec.trainer.replicas", ">= 1"),
    (with_("trainer.port", 80), "spec.trainer.port", ">= 1024"),
    (with_("trainer.resources.limits", {"nvidia.com/gpu": [8]}), "spec.trainer.resources.limits[nvidia.com/gpu]",
     None),
    (with_("rollout.backend", "sglang"), "spec.rollout.backend", "one of"),
    (with_("rollout.sampling.topP", 0), "spec.rollout.sampling.topP", "> 0"),
    (with_("rollout.gpuMemoryUtilization", 1.5), "spec.rollout.gpuMemoryUtilization", "<= 1"),
    (with_("rollout.workflow", "multi turn"), "spec.rollout.workflow", "unknown workflow"),
    (with_("weightSync.backend", "mpi"), "spec.weightSync.backend", "one of"),
    (with_("weightSync.timeoutSeconds", 0), "spec.weightSync.timeoutSeconds", ">= 1"),
    (with_("checkpoint.keepLast", 0), "spec.checkpoint.keepLast", ">= 1"),
    (with_("runPolicy.cleanPodPolicy", "Some"), "spec.runPolicy.cleanPodPolicy", "one of"),
    (with_("runPolicy.backoffLimit", -1), "spec.runPolicy.backoffLimit", ">= 0"),
    (with_("scheduling.gang", "yunikorn"), "spec.scheduling.gang", "one of"),
    (with_("rewards", []), "spec.rewards", "at least 1"),
    (with_("rewards", [{"name": "math_exact", "weight": "high"}]), "spec.rewards[0].weight", "number"),
    (with_("rewards", [{"name": "os:path:join"}]), "spec.rewards[0].name", "module:attr"),
    (with_("rewards", [{"weight": 1}]), "spec.rewards[0].name", "required"),
    (with_("dataset", {"path": "a.jsonl", "factory": "toy"}), "spec.dataset", "exactly one"),
    (with_("dataset.format", "xml"), "spec.dataset.format", "one of"),
    (with_("model.dtype", "int4"), "spec.model.dtype", "one of"),
    (with_("metadata.name", "Upper_Case"), "metadata.name", "must match"),
    (with_("weightSync.backend", "nccl", "rollout.backend", "hf"), "spec.weightSync.backend", "vllm"),
    (without("spec.model"), "spec.model", "required"),
    (without("spec.rewards"), "spec.rewards", "required"),
    (with_("spec.model", "m"), "spec.model", "object"),
    ({**MINIMAL, "kind": "TFJob"}, "kind", "GRPOJob"),
]


@pytest.mark.parametrize("doc,path,words", INVALID, ids=[f"{i}:{p}" for i, (_, p, _) in enumerate(INVALID)])
def test_invalid_manifests_name_the_field(doc, path, words):
    job, errors = check(doc)
    assert job is None, "manifest should be rejected"
    paths = [e.path for e in errors]
    assert path in paths, f"expected an error at {path}, got {[str(e) for e in errors]}"
    if words:
        msg = next(e.message for e in errors if e.path == path)
        assert words in msg, msg


def test_at_least_twenty_invalid_cases():
    assert len(INVALID) >= 20


def test_unresolvable_plugin_is_reported_when_resolving():
    doc = with_("rewards", [{"name": "no_such_module_xyz:score"}])
    assert check(doc)[1] == []  # syntax alone is fine (the operator cannot import user code)
    _, errors = check(doc, resolve_plugins=True)
    assert [e.path for e in errors] == ["spec.rewards[0].name"]
    assert "cannot import module 'no_such_module_xyz'" in errors[0].message


def test_resolvable_plugin_passes():
    doc = with_("rewards", [{"name": "grpojob.rewards.builtin:toy"}])  # a function in a reward signature
    assert check(doc, resolve_plugins=True)[1] == []


def test_set_path_keeps_types():
    doc = copy.deepcopy(MINIMAL)
    set_path(doc, "training.steps", "50")
    set_path(doc, "algorithm.dynamicSampling", "true")
    set_path(doc, "metadata.name", "x1")
    job = parse(doc)
    assert job.spec.training.steps == 50 and job.spec.algorithm.dynamic_sampling is True
    assert job.metadata.name == "x1"


def test_exponent_numbers_read_as_kubectl_reads_them(tmp_path):
    """YAML 1.2 (the API server's): `1e-6` is a number in a file and in --set, not PyYAML's string."""
    doc = copy.deepcopy(MINIMAL)
    set_path(doc, "training.learningRate", "1e-6")
    assert parse(doc).spec.training.learning_rate == 1e-6
    path = tmp_path / "job.yaml"
    path.write_text(f"apiVersion: {doc['apiVersion']}\nkind: GRPOJob\nmetadata: {{name: x}}\n"
                    f"spec:\n  model: {{path: /m}}\n  training: {{learningRate: 5E-7}}\n  metadata_note: v1e5\n")
    loaded = load_file(path)
    assert loaded["spec"]["training"]["learningRate"] == 5e-7 and loaded["spec"]["metadata_note"] == "v1e5"


# Random documents shaped like manifests: the validator must answer with errors, never raise.
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                  st.text(max_size=8), st.sampled_from(["grpo", "dapo", "hf", "vllm", "auto", "toy", "a:b"]))
_keys = st.sampled_from(["model", "dataset", "rewards", "algorithm", "training", "trainer", "rollout",
                         "weightSync", "checkpoint", "runPolicy", "path", "name", "groupSize", "factory",
                         "steps", "replicas", "backend", "sampling", "maxTokens", "x"])
_tree = st.recursive(_leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                    st.dictionaries(_keys, kids, max_size=5)), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_tree, mutate=st.dictionaries(_keys, _tree, max_size=3))
def test_random_specs_never_crash(spec, mutate):
    for doc in (spec, {**MINIMAL, "spec": spec},
                {**MINIMAL, "spec": {**MINIMAL["spec"], **mutate}}):
        job, errors = check(doc, resolve_plugins=False)
        assert (job is None) == bool(errors)
        for e in errors:
            assert isinstance(e.message, str) and e.message


def test_spec_module_imports_no_torch():
    code = ("import sys, grpojob.api, grpojob.api.crd, grpojob.plan, grpojob.cli, grpojob.config, "
            "grpojob.metrics_names; bad = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_roundtrip_dump_parse():
    job = parse(load_file(ROOT / "examples" / "qwen-gsm8k.yaml"))
    again = GRPOJob.model_validate(job.dump())
    assert again == job
