"""spec.model.lora: defaults, and bad values reported at their field path (CLI, operator, runtime)."""
from __future__ import annotations

import pytest

from grpojob.api import check
from grpojob.api.crd import openapi_schema

from .test_spec import MINIMAL, with_


def test_lora_defaults_and_peft_targets():
    job, errors = check(with_("model.lora", {}))
    assert errors == []
    lora = job.spec.model.lora
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (16, 32.0, 0.0, ["all-linear"])
    assert lora.peft_target_modules() == "all-linear"
    job, _ = check(with_("model.lora", {"rank": 8, "alpha": 16, "targetModules": ["q_proj", "v_proj"]}))
    assert job.spec.model.lora.peft_target_modules() == ["q_proj", "v_proj"]
    assert check(MINIMAL)[0].spec.model.lora is None  # unset: full fine-tuning


BAD = [
    ({"rank": 0}, "spec.model.lora.rank", ">= 1"),
    ({"rank": 2.5}, "spec.model.lora.rank", "integer"),
    ({"alpha": 0}, "spec.model.lora.alpha", "> 0"),
    ({"dropout": 1}, "spec.model.lora.dropout", "< 1"),
    ({"dropout": -0.1}, "spec.model.lora.dropout", ">= 0"),
    ({"targetModules": []}, "spec.model.lora.targetModules", "at least 1"),
    ({"targetModules": "q_proj"}, "spec.model.lora.targetModules", "list"),
    ({"targetModules": ["q_proj", "all-linear"]}, "spec.model.lora.targetModules[1]", "stands alone"),
    ({"targetModules": ["q_proj", "q_proj"]}, "spec.model.lora.targetModules[1]", "twice"),
    ({"targetModules": ["q proj"]}, "spec.model.lora.targetModules[0]", "match"),
    ({"rnak": 8}, "spec.model.lora.rnak", "unknown field"),
]


@pytest.mark.parametrize("lora,path,words", BAD, ids=[p.rsplit(".", 1)[1] + str(i) for i, (_, p, _) in enumerate(BAD)])
def test_bad_lora_names_the_field(lora, path, words):
    job, errors = check(with_("model.lora", lora))
    assert job is None
    found = {e.path: e.message for e in errors}
    assert path in found, [str(e) for e in errors]
    assert words in found[path], found[path]


def test_crd_bounds_the_target_list():
    lora = openapi_schema()["properties"]["spec"]["properties"]["model"]["properties"]["lora"]
    targets = lora["properties"]["targetModules"]
    assert targets["minItems"] == 1 and targets["maxItems"] >= 8 and targets["items"]["maxLength"] <= 256
    assert lora["properties"]["rank"]["minimum"] == 1
