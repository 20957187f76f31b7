"""The CRD fits the API server's CEL cost budget (docs/real-cluster-rules.md). kube-apiserver
estimates every x-kubernetes-validations rule when a CRD is applied and refuses one above its
limits; kmock and cel-python estimate nothing, so a CRD that v1.36.2 refused passed every other
test (issue 22). The estimator (tests/helpers/cel_cost.py, crd_limits.py) is checked here against
the costs Kubernetes' own tests expect, and against the refusal the real server gave."""
from __future__ import annotations

import copy

import pytest

from grpojob.api import k8s
from grpojob.api.crd import crd
from tests.helpers.cel_ast import Unsupported
from tests.helpers.cel_cost import rule_cost
from tests.helpers.crd_limits import (CRD_LIMIT, MAX_REQUEST, PER_RULE_LIMIT, decl_of, refusals, rule_costs,
                                      total)
from tools.vendor_k8s_schemas import RESOURCE_MAP_MAX


def _item(kind):
    if kind == "int-or-string":
        return {"x-kubernetes-int-or-string": True}
    if kind in ("duration", "date", "date-time"):
        return {"type": "string", "format": kind}
    return {"type": kind}


def _bounded(schema, key, n):
    return schema if n is None else {**schema, key: n}


# The schemas of kubernetes/apiextensions-apiserver pkg/apiserver/schema/cel/compilation_test.go
# (genArrayWithRule, genMapWithRule, ...), given their bound n (None: unbounded).
def array(kind):
    return lambda n: _bounded({"type": "array", "items": _item(kind)}, "maxItems", n)


def map_of(kind):
    return lambda n: _bounded({"type": "object", "additionalProperties": _item(kind)}, "maxProperties", n)


def string(n):
    return _bounded({"type": "string"}, "maxLength", n)


def objects(n):
    item = {"type": "object", "required": ["required"],
            "properties": {"required": {"type": "string"}, "optional": {"type": "string"}}}
    return _bounded({"type": "array", "items": item}, "maxItems", n)


def strings_map(n):  # genNestedSpecWithRule: the bound is both maxProperties and the values' maxLength
    return _bounded({"type": "object", "additionalProperties": string(n)}, "maxProperties", n)


def maps_array(n):
    return _bounded({"type": "array", "items": {"type": "object", "additionalProperties": {"type": "number"}}},
                    "maxItems", n)


# TestCostEstimation's cases: (schema, rule, cost unbounded (None: above the limit), bound, cost bounded).
K8S_CASES = [
    (array("number"), "self.all(x, true)", 4718591, 10, 32),
    (array("string"), "self.all(x, true)", 3145727, 20, 62),
    (array("boolean"), "self.all(x, true)", 1887437, 5, 17),
    (objects, "self.all(x, true)", 555128, 50, 152),
    (map_of("number"), "self.all(x, true)", 1348169, 10, 32),
    (map_of("string"), "self.all(x, true)", 1179647, 3, 11),
    (map_of("boolean"), "self.all(x, true)", 943718, 100, 302),
    (string, "self.contains('test')", 314574, 10, 5),
    (string, "self.startsWith('test')", 2, 15, 2),
    (string, 'size(self + "hello") > size("hello")', 314578, 4, 7),
    (array("number"), "self[1] == 0.0", 2, 5000, 2),
    (array("string"), "self[1] == self[1]", 314577, 8, 314577),
    (array("number"), "self.all(x, self.all(y, true))", None, 10, 352),
    (array("number"), "self.all(x, self.all(y, self.all(z, true)))", None, 10, 3552),
    (string, 'self.matches("x")', 314574, 50, 22),
    (string, '"".matches("(((((((((())))))))))[0-9]")', 7, 10, 7),
    (string, 'self.matches("")', 1, 100, 1),
    (strings_map, "self.all(x, x.contains(self[x]))", 2752507, 10, 72),  # a map key's size is 0
    (map_of("number"), 'self["x"] == 0.0', 2, 0, 2),
    (string, 'self == "x"', 2, 0, 1),
    (array("number"), "self.all(x, x == 0.0)", 6291454, 3 * 1024 * 2048, 25165826),
    (array("int-or-string"), "self.all(x, true)", 4718591, 10, 32),
    (array("int-or-string"), "self[0] == 5", 3, 10, 3),
    (objects, "self[0] == null", 2, 422, 2),
    (maps_array, "self.all(x, x.y == 25.2)", 6291452, 12, 74),
    (maps_array, "self[0].x > 2.0", 4, 3000, 4),
    (array("duration"), "self.all(x, true)", 2359295, 5, 17),
    (array("date"), "self.all(x, true)", 725936, 15, 47),
    (array("date-time"), "self.all(x, true)", 428963, 25, 77),
    (map_of("int-or-string"), "self.all(x, true)", 1348169, 15, 47),
    (map_of("duration"), "self.all(x, true)", 1048577, 5, 17),
]


@pytest.mark.parametrize("schema, rule, unbounded, n, bounded", K8S_CASES, ids=[c[1] for c in K8S_CASES])
def test_the_estimator_gives_the_costs_kubernetes_tests_expect(schema, rule, unbounded, n, bounded):
    cost = rule_cost(rule, decl_of(schema(None)))
    assert cost == unbounded if unbounded is not None else cost > PER_RULE_LIMIT
    assert rule_cost(rule, decl_of(schema(n))) == bounded


# kubernetes/apiserver pkg/cel/library/cost_test.go TestQuantityCost: (expression, estimated cost).
QUANTITY_CASES = [
    ('quantity("12Mi")', 1), ('isQuantity("20M")', 1), ('quantity("200M") == quantity("200M")', 3),
    ('quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")', 6),
    ('quantity("50M").isLessThan(quantity("50Mi"))', 3), ('quantity("200M").compareTo(quantity("0.2G")) > 0', 4),
    ('quantity("50k").add(quantity("20")) == quantity("50.02k")', 5),
    ('quantity("50k").sub(20) == quantity("49980")', 4),
    ('quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() > 0', 7),
    ('quantity("50").isInteger()', 2), ('quantity("50.703k").asApproximateFloat() > 0.0', 3),
]


@pytest.mark.parametrize("expression, cost", QUANTITY_CASES)
def test_the_estimator_costs_the_kubernetes_quantity_library(expression, cost):
    assert rule_cost(expression, decl_of(string(None))) == cost


def test_quantity_costs_the_traversal_of_its_argument():
    """library/cost.go: quantity() of a schema value costs its size x 0.1 (maxLength 64: 256 bytes)."""
    assert rule_cost("quantity(self).isInteger()", decl_of(string(64))) == 26 + 1 + 1
    assert rule_cost("quantity(self).isInteger()", decl_of(string(None))) == 314573 + 1 + 1


def test_a_construct_the_estimator_does_not_know_fails_loudly():
    """A rule the estimator cannot cost must fail its test, not pass unestimated."""
    for rule in ("self.exists(x, x.indexOf('a') > 0)", "cel.bind(x, self, size(x) > 0)", "self.nosuchfield == 1"):
        with pytest.raises(Unsupported):
            rule_cost(rule, decl_of(array("string")(4)))


def _schema():
    return copy.deepcopy(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


# The resource-name rule of the CRD that v1.36.2 refused (tools/vendor_k8s_schemas.py at the time).
REPORTED_RULE = ("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-') || "
                 "(k.contains('/') && !k.startsWith('kubernetes.io/') && !k.startsWith('requests.') && "
                 "k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
                 "([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$')))")


def test_the_estimator_refuses_the_crd_v1_36_refused_with_its_words():
    """The CRD as applied in issue 22: spec.environments without maxItems, the resource rule of the
    time. The API server answered these three errors; the estimator gives them word for word."""
    schema = _schema()
    spec = schema["properties"]["spec"]["properties"]
    spec["environments"].pop("maxItems", None)
    # The CRD of the time had no other rule under environments (the key rules of labels,
    # annotations and node selectors and the toleration rules came with issue 31).
    for prop in spec["environments"]["items"]["properties"].values():
        prop.pop("x-kubernetes-validations", None)
        prop.get("items", {}).pop("x-kubernetes-validations", None)
    for role in ("trainer", "rollout"):
        for m in ("limits", "requests"):
            spec[role]["properties"]["resources"]["properties"][m]["x-kubernetes-validations"][0]["rule"] = \
                REPORTED_RULE
            spec["environments"]["items"]["properties"]["resources"]["properties"][m][
                "x-kubernetes-validations"][0]["rule"] = REPORTED_RULE
    hint = ("(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, "
            "and strings are declared)")
    where = "spec.validation.openAPIV3Schema.properties[spec].properties[environments].items.properties[resources]"
    assert refusals(rule_costs(schema)) == [
        f"{where}.properties[limits].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds "
        f"budget by factor of more than 100x {hint}",
        f"{where}.properties[requests].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds "
        f"budget by factor of more than 100x {hint}",
        f"x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor "
        f"of 37.6x {hint}",
    ]


def _table(costs):
    return "\n".join(f"{c.cost / PER_RULE_LIMIT:9.5f} of the rule limit ({c.max_cost} x {c.cardinality}) {c.path}"
                     for c in sorted(costs, key=lambda c: -c.cost))


def test_every_rule_and_the_total_stay_far_below_the_api_servers_limits():
    """A tenth of each limit: room for estimator versions that cost a little more than ours."""
    costs = rule_costs(_schema())
    assert len(costs) >= 8 and refusals(costs) == []
    assert all(c.cost < PER_RULE_LIMIT / 10 for c in costs), _table(costs)
    assert total(costs) < CRD_LIMIT / 10, _table(costs)


def test_no_rule_cost_leans_on_the_request_size():
    """Every list or map above a rule declares maxItems/maxProperties, and whatever a rule iterates or
    reads has a declared bound: its cost stays the same if the server took requests twice as large."""
    costs = rule_costs(_schema())
    assert [c.path for c in costs if not c.bounded] == []
    assert [(c.path, c.cost) for c in rule_costs(_schema(), request=2 * MAX_REQUEST)] == \
        [(c.path, c.cost) for c in costs]


def test_the_environments_bound_is_the_documented_one():
    envs = _schema()["properties"]["spec"]["properties"]["environments"]
    assert f"At most {envs['maxItems']}" in envs["description"]
    resources = k8s.schema("ResourceRequirements")["properties"]
    assert resources["limits"]["maxProperties"] == resources["requests"]["maxProperties"] == RESOURCE_MAP_MAX
