"""spec.judges and spec.rewards[].judge: what is refused (with field paths), what the plan renders,
and that a job without judges renders exactly what it did."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from grpojob.api import check
from grpojob.plan import ENV_JUDGE, ENV_JUDGE_PORT, ENV_JUDGE_URLS, Placement, render_config, roles

ROOT = Path(__file__).resolve().parents[2]


def _doc(rewards, judges) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "tiny-local.yaml").read_text())
    doc["spec"]["rewards"], doc["spec"]["judges"] = rewards, judges
    return doc


def _errors(doc) -> dict[str, str]:
    _, errors = check(doc)
    return {e.path: e.message for e in errors}


def test_refusals_name_their_fields():
    errors = _errors(_doc([{"judge": "cats"}, {"name": "toy", "judge": "dogs"}, {}],
                          [{"name": "dogs", "model": "/m"}, {"name": "dogs", "model": "/n"}]))
    assert "no judge 'cats' in spec.judges (declared: dogs, dogs)" in errors["spec.rewards[0].judge"]
    assert "not both" in errors["spec.rewards[1].judge"]
    assert "required" in errors["spec.rewards[2].name"]
    assert "used twice" in errors["spec.judges[1].name"]
    errors = _errors(_doc([{"judge": "q"}], [{"name": "q", "model": "/m", "template": "{prompt} {answer}"}]))
    assert "may name only {prompt} and {completion}" in errors["spec.judges[0].template"]
    errors = _errors(_doc([{"judge": "q"}], [{"name": "q", "model": "/m", "onFailure": "retry-forever"}]))
    assert "spec.judges[0].onFailure" in errors
    errors = _errors(_doc([{"name": "toy"}], [{"name": "q", "model": "/m"}]))
    assert "named by no spec.rewards[].judge" in errors["spec.judges[0].name"]


def test_defaults_a_careful_user_wants():
    job, errors = check(_doc([{"judge": "q"}], [{"name": "q", "model": "/m"}]))
    assert not errors
    j = job.spec.judges[0]
    assert (j.on_failure, j.retries, j.engine, j.score.transform, j.replicas) == ("skip", 3, "hf", "sigmoid", 1)


def _where(**kw) -> Placement:
    return Placement(trainer_host="10.0.0.1", config_path="/c/grpojob.json", checkpoint_dir="/ck", run_dir="/r",
                     token_file="/t/token", **kw)


def test_plan_renders_a_judge_role_and_tells_the_trainer_where_it_is():
    job, _ = check(_doc([{"judge": "quality", "weight": 2.0}],
                        [{"name": "quality", "model": "/models/rm", "replicas": 2, "port": 8123}]))
    rs = {r.name: r for r in roles(job, _where())}
    judge = rs["judge-quality"]
    assert judge.command == ["grpojob", "judge"] and judge.replicas == 2 and judge.ports == {"http": 8123}
    assert judge.env[ENV_JUDGE] == "quality" and judge.env[ENV_JUDGE_PORT] == "8123" and judge.judge == "quality"
    assert "GRPOJOB_SYNC_ADDR" not in judge.env  # frozen: never in weight sync
    assert json.loads(rs["trainer"].env[ENV_JUDGE_URLS]) == {"quality": ["http://tiny-local-judge-quality:8123"]}
    local = {r.name: r for r in roles(job, _where(judge_urls={"quality": ("http://127.0.0.1:1", "http://127.0.0.1:2")}))}
    assert json.loads(local["trainer"].env[ENV_JUDGE_URLS]) == {"quality": ["http://127.0.0.1:1", "http://127.0.0.1:2"]}


def test_a_job_without_judges_renders_what_it_did():
    job, _ = check(yaml.safe_load((ROOT / "examples" / "tiny-local.yaml").read_text()))
    rs = roles(job, _where())
    assert [r.name for r in rs] == ["trainer", "rollout"]
    assert all(ENV_JUDGE_URLS not in r.env for r in rs)


GENERATIVE = {"name": "q", "model": "/m", "kind": "generative", "template": "Rate: {completion}",
              "score": {"pattern": r"score: (\d+)", "min": 0, "max": 9}}


def test_a_generative_judge_and_its_defaults():
    job, errors = check(_doc([{"judge": "q"}], [{**GENERATIVE, "system": "You grade answers."}]))
    assert not errors, errors
    j = job.spec.judges[0]
    assert (j.kind, j.max_tokens, j.temperature, j.system, j.on_failure) == ("generative", 32, 0.0,
                                                                             "You grade answers.", "skip")
    job, _ = check(_doc([{"judge": "q"}], [{"name": "q", "model": "/m"}]))
    assert job.spec.judges[0].kind == "classifier"  # nothing existing changes


def test_fields_of_the_other_kind_are_refused_with_their_paths():
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "score": {**GENERATIVE["score"], "transform": "logit",
                                                                       "label": 1}}]))
    assert "applies to kind classifier only" in errors["spec.judges[0].score.transform"]
    assert "spec.judges[0].score.label" in errors
    errors = _errors(_doc([{"judge": "q"}], [{"name": "q", "model": "/m", "system": "s", "maxTokens": 4,
                                              "temperature": 0.5, "score": {"pattern": "(x)", "max": 3}}]))
    assert set(errors) == {f"spec.judges[0].{f}" for f in ("system", "maxTokens", "temperature", "score.pattern",
                                                           "score.max")}
    assert all("applies to kind generative only (this judge is classifier)" in m for m in errors.values())


def test_a_generative_judge_needs_a_rubric_and_a_parser_that_can_read_a_number():
    errors = _errors(_doc([{"judge": "q"}], [{"name": "q", "model": "/m", "kind": "generative"}]))
    assert "required for kind generative" in errors["spec.judges[0].score.pattern"]
    assert "rubric" in errors["spec.judges[0].template"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "score": {"pattern": "score: \\d+"}}]))
    assert "has 0 groups: it needs exactly one" in errors["spec.judges[0].score.pattern"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "score": {"pattern": "(a)(b)"}}]))
    assert "has 2 groups" in errors["spec.judges[0].score.pattern"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "score": {"pattern": "(unclosed"}}]))
    assert "not a regular expression" in errors["spec.judges[0].score.pattern"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "score": {"pattern": "(\\d)", "min": 5, "max": 5}}]))
    assert "must be above score.min (5)" in errors["spec.judges[0].score.max"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "template": "Rate: {prompt}"}]))
    assert "must name {completion}" in errors["spec.judges[0].template"]
    errors = _errors(_doc([{"judge": "q"}], [{**GENERATIVE, "maxTokens": 0, "temperature": -1}]))
    assert {"spec.judges[0].maxTokens", "spec.judges[0].temperature"} <= set(errors)


def test_the_runtime_config_of_a_judge_job_checks_again():
    """The config the operator and `grpojob run` hand to every pod (plan.render_config) writes each
    field, defaults included: read back by the trainer and the judge, it must not be refused (the
    other kind's defaults are not fields written for the wrong kind)."""
    for judge in ({"name": "q", "model": "/m"}, GENERATIVE):
        job, errors = check(_doc([{"judge": "q"}], [judge]))
        assert not errors, errors
        doc = json.loads(render_config(job))
        again, errors = check({**doc, "apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob"}, resolve_plugins=False)
        assert not errors and again.spec.judges == job.spec.judges, errors
