"""Each Kubernetes rule of grpojob.api.cluster_rules / names / quantity, and the spec-side rules of
issue 31 (arguments, LoRA targets), with hand-computed expectations: valid and invalid cases."""
from __future__ import annotations

import inspect
from fractions import Fraction

import pytest

from grpojob.api import arguments, check, cluster_rules, lora, names, quantity

from .test_spec import with_

# -- quantities (apimachinery resource.ParseQuantity) ----------------------------------------------

QUANTITIES = [
    ("1Gi", Fraction(2 ** 30)), ("1024Mi", Fraction(2 ** 30)), ("500m", Fraction(1, 2)), ("0.5", Fraction(1, 2)),
    ("1e3", Fraction(1000)), ("1k", Fraction(1000)), ("1E-3", Fraction(1, 1000)), (8, Fraction(8)),
    ("+.5", Fraction(1, 2)), ("-1", Fraction(-1)), ("100n", Fraction(1, 10 ** 7)), ("2.5Ki", Fraction(2560)),
    ("1.", Fraction(1)), ("16G", Fraction(16 * 10 ** 9)),
]


@pytest.mark.parametrize("text, value", QUANTITIES, ids=[str(q) for q, _ in QUANTITIES])
def test_quantities_parse_exactly(text, value):
    assert quantity.parse(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1gi", "1KiB", "1e", "1.5e1.5", "x", "1Mi2", True, 1.5, None])
def test_what_is_not_a_quantity(text):
    assert quantity.parse(text) is None


# -- names (apimachinery validation.go) -----------------------------------------------------------

@pytest.mark.parametrize("key, ok", [
    ("app", True), ("example.com/role", True), ("a.b_c-d", True), ("A1", True), ("x" * 63, True),
    ("x" * 64, False), ("-app", False), ("app.", False), ("bad key", False), ("/x", False), ("a/b/c", False),
    ("Example.com/x", False), ("example.com/", False), ("e" * 254 + "/x", False), ("", False)])
def test_qualified_names(key, ok):
    assert (names.qualified_name(key) == []) == ok


@pytest.mark.parametrize("value, ok", [("", True), ("a", True), ("v1.2-rc_3", True), ("x" * 63, True),
                                       ("x" * 64, False), ("-a", False), ("a b", False), ("a/b", False)])
def test_label_values(value, ok):
    assert (names.label_value(value) == []) == ok


@pytest.mark.parametrize("value, label, subdomain", [
    ("my-name", True, True), ("my.name", False, True), ("My-Name", False, False), ("a" * 63, True, True),
    ("a" * 64, False, True), ("a" * 254, False, False), ("-a", False, False), ("a-", False, False),
    ("a_b", False, False), ("", False, False)])
def test_dns1123_names(value, label, subdomain):
    assert (names.dns1123_label(value) == []) == label
    assert (names.dns1123_subdomain(value) == []) == subdomain


def test_labels_and_annotations_report_every_bad_entry():
    assert names.labels({"app": "x", "bad key": "ok", "team": "-x"}) == [
        ("[bad key]", "'bad key': the name part " + names._NAME_WORDS),
        ("[team]", "'-x': a label value " + names._NAME_WORDS)]
    # annotation values are free; keys are compared in lower case
    assert names.annotations({"Example.com/Note": "any text at all: !"}) == []
    big = {"a": "x" * names.ANNOTATIONS_TOTAL_MAX}
    assert names.annotations(big) == [("", f"annotations may total at most {names.ANNOTATIONS_TOTAL_MAX} bytes "
                                           f"(keys and values), not {names.ANNOTATIONS_TOTAL_MAX + 1}")]


# -- tolerations (validation.go ValidateTolerations) -------------------------------------------------

@pytest.mark.parametrize("toleration, paths", [
    ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, []),
    ({"operator": "Exists"}, []),  # matches every taint
    ({"key": "gpu", "value": "a100"}, []),  # empty operator is Equal
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}, []),
    ({"key": "gpu", "operator": "Bogus", "effect": "Whatever"}, [".operator", ".effect"]),
    ({"operator": "Equal", "value": "x"}, [".operator"]),
    ({"key": "gpu", "operator": "Exists", "value": "a100"}, [".value"]),
    ({"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 60}, [".effect"]),
    ({"key": "bad key", "value": "-x"}, [".key", ".value"]),
])
def test_tolerations(toleration, paths):
    assert [p for p, _ in cluster_rules.toleration(toleration)] == paths


# -- resources (validation.go ValidateContainerResourceRequirements) --------------------------------

@pytest.mark.parametrize("resources, found", [
    ({"requests": {"memory": "1024Mi", "cpu": "500m"}, "limits": {"memory": "1Gi", "cpu": "0.5"}}, []),
    ({"requests": {"cpu": 2}, "limits": {"cpu": "2000m"}}, []),
    ({"requests": {"memory": "1Gi"}}, []),  # no limit: cpu and memory may be overcommitted
    ({"limits": {"nvidia.com/gpu": 8}}, []),  # the request defaults to the limit
    ({"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}},
     [(".requests[memory]", "2Gi must be less than or equal to the memory limit of 1Gi")]),
    ({"requests": {"cpu": "1001m"}, "limits": {"cpu": 1}},
     [(".requests[cpu]", "1001m must be less than or equal to the cpu limit of 1")]),
    ({"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}},
     [(".requests[nvidia.com/gpu]", "1 must be equal to the nvidia.com/gpu limit of 2 (nvidia.com/gpu cannot be "
                                    "overcommitted)")]),
    ({"requests": {"nvidia.com/gpu": 1}},
     [(".limits[nvidia.com/gpu]", "required: nvidia.com/gpu cannot be overcommitted, so its request of 1 needs a "
                                  "limit (equal to it)")]),
    ({"limits": {"nvidia.com/gpu": "500m"}}, [(".limits[nvidia.com/gpu]", "500m: an extended resource must be a "
                                                                           "whole number")]),
    ({"requests": {"memory": "-1Gi"}}, [(".requests[memory]", "-1Gi must be greater than or equal to 0")]),
    ({"limits": {"hugepages-2Mi": "3Mi", "memory": "1Gi"}},
     [(".limits[hugepages-2Mi]", "3Mi is not a whole multiple of the page size 2Mi")]),
    ({"limits": {"hugepages-2Mi": "4Mi"}}, [("", "hugepages need a cpu or memory request or limit as well")]),
])
def test_resources(resources, found):
    assert cluster_rules.resources(resources) == found


# -- selectors (ValidateNodeSelectorRequirement, ValidateLabelSelectorRequirement) -----------------

@pytest.mark.parametrize("requirement, paths", [
    ({"key": "zone", "operator": "In", "values": ["a", "b"]}, []),
    ({"key": "zone", "operator": "NotIn", "values": []}, [".values"]),
    ({"key": "gpu", "operator": "Exists"}, []),
    ({"key": "gpu", "operator": "DoesNotExist", "values": ["x"]}, [".values"]),
    ({"key": "mem", "operator": "Gt", "values": ["3"]}, []),
    ({"key": "mem", "operator": "Gt", "values": ["-3"]}, [".values[0]"]),  # an integer, but not a label value
    ({"key": "mem", "operator": "Lt", "values": ["3.5"]}, [".values[0]"]),
    ({"key": "mem", "operator": "Gt", "values": [str(2 ** 63)]}, [".values[0]"]),  # beyond int64
    ({"key": "mem", "operator": "Gt"}, [".values"]),
    ({"key": "zone", "operator": "Near", "values": ["x"]}, [".operator"]),
    ({"key": "bad key", "operator": "In", "values": ["a b"]}, [".key", ".values[0]"]),
])
def test_node_selector_requirements(requirement, paths):
    assert [p for p, _ in cluster_rules.node_selector_requirement(requirement)] == paths


@pytest.mark.parametrize("requirement, paths", [
    ({"key": "app", "operator": "In", "values": ["web"]}, []),
    ({"key": "app", "operator": "In"}, [".values"]),
    ({"key": "app", "operator": "Exists", "values": ["web"]}, [".values"]),
    ({"key": "app", "operator": "Gt", "values": ["1"]}, [".operator"]),  # Gt is for nodes only
])
def test_label_selector_requirements(requirement, paths):
    assert [p for p, _ in cluster_rules.label_selector_requirement(requirement)] == paths


def test_affinity_names_every_problem_with_its_path():
    req, pref = "requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution"
    affinity = {
        "nodeAffinity": {req: {"nodeSelectorTerms": []},
                         pref: [{"weight": 0, "preference": {"matchFields": [
                             {"key": "metadata.name", "operator": "In", "values": ["a", "b"]},
                             {"key": "spec.nodeName", "operator": "Exists", "values": ["Node_1"]}]}}]},
        "podAffinity": {req: [{"topologyKey": "", "namespaces": ["ML"],
                               "labelSelector": {"matchLabels": {"app": "-x"}}}]},
    }
    assert [p for p, _ in cluster_rules.affinity(affinity)] == [
        f".nodeAffinity.{req}.nodeSelectorTerms",
        f".nodeAffinity.{pref}[0].weight",
        f".nodeAffinity.{pref}[0].preference.matchFields[0].values",
        f".nodeAffinity.{pref}[0].preference.matchFields[1].operator",
        f".nodeAffinity.{pref}[0].preference.matchFields[1].key",
        f".nodeAffinity.{pref}[0].preference.matchFields[1].values[0]",
        f".podAffinity.{req}[0].labelSelector.matchLabels[app]",
        f".podAffinity.{req}[0].namespaces[0]",
        f".podAffinity.{req}[0].topologyKey",
    ]


def test_volumes_and_env_name_valid_objects():
    assert cluster_rules.volume({"name": "hf", "persistentVolumeClaim": {"claimName": "hf-cache"}}) == []
    assert [p for p, _ in cluster_rules.volume({"name": "HF", "secret": {"secretName": "Tok_en"}})] == \
        [".name", ".secret.secretName"]
    assert [p for p, _ in cluster_rules.volume({"name": "c", "configMap": {"name": "my.cm-"}})] == [".configMap.name"]
    assert cluster_rules.env_var({"name": "my.var-1", "value": "x"}) == []  # relaxed names (1.34)
    bad = {"name": "A=B", "valueFrom": {"secretKeyRef": {"name": "HF", "key": "to ken"}}}
    assert [p for p, _ in cluster_rules.env_var(bad)] == [".name", ".valueFrom.secretKeyRef.name",
                                                         ".valueFrom.secretKeyRef.key"]


# -- dataset arguments -----------------------------------------------------------------------------

def test_the_declared_builtin_dataset_signatures_are_the_functions_own():
    from grpojob.data import builtin

    assert set(arguments.BUILTIN_DATASETS) == set(builtin.DATASETS)
    for name, declared in arguments.BUILTIN_DATASETS.items():
        real = inspect.signature(builtin.DATASETS[name], eval_str=True).parameters
        mine = inspect.signature(declared, eval_str=True).parameters
        assert [(p.name, p.kind, p.default) for p in mine.values()] == \
            [(p.name, p.kind, p.default) for p in real.values()], name
        for p in real.values():  # the same types, whatever the spelling (list[str] | None, Optional)
            assert typing_args(mine[p.name].annotation) == typing_args(p.annotation), (name, p.name)


def typing_args(annotation):
    """A union as the set of its members (Optional[X] == X | None), anything else as itself."""
    import types
    import typing

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return frozenset(typing.get_args(annotation))
    return annotation


@pytest.mark.parametrize("args, found", [
    ({"size": 8, "seed": 1, "categories": ["animals"]}, []),
    ({"categories": None}, []),
    ({"noSuchField": 1}, [(".noSuchField", "unknown argument: toy takes categories, size, seed")]),
    ({"size": "x"}, [(".size", "must be an integer (as toy annotates it), not 'x'")]),
    ({"size": True}, [(".size", "must be an integer (as toy annotates it), not True")]),
    ({"categories": "animals"}, [(".categories", "must be a list of strings or null (as toy annotates it), "
                                                 "not 'animals'")]),
])
def test_builtin_dataset_args(args, found):
    assert arguments.problems(arguments.BUILTIN_DATASETS["toy"], args, "toy") == found


def test_arguments_of_plain_functions_and_classes():
    def f(path: str, n: int = 1, *, scale: float = 1.0, mode: "str | None" = None):
        pass

    class C:
        def __init__(self, n, **options):
            pass

    assert arguments.problems(f, {"path": "p", "n": 2, "scale": 2, "mode": None}) == []  # an int is a float
    assert arguments.problems(f, {"scale": "big", "extra": 1}) == [
        (".scale", "must be a number (as the function annotates it), not 'big'"),
        (".extra", "unknown argument: the function takes path, n, scale, mode"),
        ("", "missing required argument 'path' of the function")]
    assert arguments.problems(C, {"n": "anything", "whatever": 1}) == []  # unannotated, **options


def test_a_builtin_dataset_with_bad_args_is_refused_by_check():
    _, errors = check(with_("dataset", {"factory": "countdown", "args": {"max_number": "20", "rows": 1}}))
    assert [str(e) for e in errors] == [
        "spec.dataset.args.max_number: must be an integer (as the built-in dataset countdown annotates it), not '20'",
        "spec.dataset.args.rows: unknown argument: the built-in dataset countdown takes size, count, max_number, seed"]


# -- LoRA targets ----------------------------------------------------------------------------------

def test_lora_targets_that_no_causal_lm_can_take():
    assert lora.target_problems(["q_proj", "self_attn.o_proj", "all-linear"]) == []
    assert [p for p, _ in lora.target_problems(["lm_head", "model.lm_head", "q_proj.weight", "a..b", "x."])] == \
        ["[0]", "[2]", "[3]", "[4]"]  # model.lm_head would need a module named model.model.lm_head
    assert lora.output_layer_problems(["q_proj", "embed_out"], output_layer="embed_out")[0][0] == "[1]"
    assert lora.matches("q_proj", "model.layers.0.self_attn.q_proj")
    assert not lora.matches("proj", "model.layers.0.self_attn.q_proj")


def test_the_cross_field_rules_of_a_valid_spec_stay_quiet_and_all_are_reported_together():
    job, errors = check(with_("placement", "colocated"))
    assert errors == [] and job is not None
    _, errors = check(with_("placement", "colocated", "trainer.replicas", 2, "weightSync.backend", "gloo"))
    assert [e.path for e in errors] == ["spec.trainer.replicas", "spec.weightSync.backend"]
