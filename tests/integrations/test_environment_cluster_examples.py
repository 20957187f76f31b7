"""The skyrl-gym and TRL cluster examples bring into their pods exactly what their environment's code
imports beyond the runtime image (as examples/environments/atropos/words-cluster.yaml does, checked in
test_atropos_launch.py), and a SkyRL driver finds its dataset rows in the ConfigMap that brought them."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from grpojob import plan
from grpojob.api import load_manifest, parse
from grpojob.integrations import job_env
from grpojob_operator import children

from .test_atropos_launch import IMAGE_EXTRAS, VLLM_BRINGS, _norm, _required

ROOT = Path(__file__).resolve().parents[2]


def imported_beyond_the_image(directory: Path, module: str) -> set[str]:
    """The distributions `import module` loads (from `directory`, in a fresh interpreter) that the
    runtime image does not install."""
    probe = (f"import sys, json, importlib.metadata as m; sys.path.insert(0, sys.argv[1]); import {module}; "
             "d = m.packages_distributions(); "
             "print(json.dumps(sorted({x for k in list(sys.modules) for x in d.get(k.split('.')[0], [])})))")
    out = subprocess.run([sys.executable, "-c", probe, str(directory)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    image = {n for n, _ in _required("grpojob", IMAGE_EXTRAS)} | VLLM_BRINGS
    return {_norm(d) for d in json.loads(out.stdout)} - image


def pod_of(job, kind: str, name: str) -> dict:
    objs = {children.key(o): o for o in children.build(job, namespace="ml")}
    return objs[(kind, name)]["spec"]["template"]["spec"]


def test_the_skyrl_cluster_example_brings_skyrl_gym_and_its_rows():
    pytest.importorskip("skyrl_gym", reason="skyrl-gym (the environments set)")
    here = ROOT / "examples/environments/skyrl"
    job = parse(load_manifest(here / "words-cluster.yaml"))
    pod = pod_of(job, "Deployment", "skyrl-words-env-words")
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "grpojob.integrations.skyrl_gym", "--data", "rows.jsonl",
                            "--import", "words_env"]
    assert [i["command"] for i in pod["initContainers"]] == [plan.install_code_command()]
    assert {"name": "grpojob-code", "configMap": {"name": "skyrl-words-env"}} in pod["volumes"]
    pip = {_norm(Requirement(r).name): Requirement(r) for r in job.spec.code.pip}
    assert job.spec.code.pip_args == ["--no-deps"]
    assert set(pip) == imported_beyond_the_image(here, "words_env")
    for name, req in pip.items():
        assert req.specifier.contains(metadata.version(name)), f"{req} does not allow the {name} CI tests"


def test_a_driver_finds_its_rows_under_the_code_directory_when_the_working_directory_lacks_them(
        tmp_path, monkeypatch):
    here = ROOT / "examples/environments/skyrl"
    monkeypatch.chdir(tmp_path)  # a pod's working directory: the image's, not the ConfigMap's
    monkeypatch.delenv("GRPOJOB_CODE_DIR", raising=False)
    with pytest.raises(SystemExit, match=r"--data rows.jsonl: no such file \(looked in .*rows.jsonl\)"):
        job_env.json_lines("rows.jsonl")
    monkeypatch.setenv("GRPOJOB_CODE_DIR", str(here))  # the mounted ConfigMap (plan.ENV_CODE_DIR)
    rows = [json.loads(x) for x in (here / "rows.jsonl").read_text().splitlines() if x.strip()]
    assert job_env.json_lines("rows.jsonl") == rows
    (tmp_path / "rows.jsonl").write_text('{"prompt": []}\n')  # the working directory's wins, as given
    assert job_env.json_lines("rows.jsonl") == [{"prompt": []}]
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit, match="--data .*bad.jsonl: not JSON lines"):
        job_env.json_lines("bad.jsonl")


def test_the_trl_cluster_example_needs_nothing_beyond_the_image():
    here = ROOT / "examples/environments/trl"
    job = parse(load_manifest(here / "words-cluster.yaml"))
    assert job.spec.code.pip == [] and job.spec.rollout.workflow == "workflow:Workflow"
    pod = pod_of(job, "StatefulSet", "trl-words-trainer")  # the workflow runs in the trainer's leader
    assert {"name": "grpojob-code", "configMap": {"name": "trl-words-env"}} in pod["volumes"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[plan.ENV_CODE_DIR] in env["PYTHONPATH"].split(":")
    assert imported_beyond_the_image(here, "workflow") == set()
