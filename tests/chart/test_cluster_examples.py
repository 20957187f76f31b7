"""Every example states where it runs (a `# Runs:` line), and every one that runs on a cluster does so
as written: rendered through the operator's children with the chart's runtime image, each model a
pod loads (the policy in the trainer and rollout pods, a judge's in its pod) is at an absolute path
that the image's recipe builds, or on a claim the example names as needed (a model the platform
team filled beforehand). A relative path, or a model only `grpojob run` builds, would not be there."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpojob import plan
from grpojob.api import load_manifest, parse
from grpojob.local import image_models
from grpojob_operator import children
from grpojob_operator import names as n

from .conftest import ROOT
from .test_images import DOCKERFILES, read_dockerfile

EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "kind: GRPOJob" in p.read_text())
CLUSTER = [p for p in EXAMPLES if "on a cluster" in re.search(r"^# Runs: (.*)$", p.read_text(), re.M).group(1)]
# the recipe's builders: the tiny policy (`grpojob tiny`), a policy converted from a GGUF file
# (`grpojob model convert SOURCE --out PATH`) and the toy task's reward model (a judge's)
BUILDERS = {"policy": r"grpojob (?:tiny|model convert \S+ --out) (\S+)", "judge": r"grpojob\.judge\.tiny (\S+)"}


def built_in_image() -> dict[str, set[str]]:
    runs = " ".join(read_dockerfile(DOCKERFILES["runtime"])[-1].all("RUN"))
    return {kind: set(re.findall(rx, runs)) for kind, rx in BUILDERS.items()}


def runs(path: Path) -> str:
    return re.search(r"^# Runs: (.*)$", path.read_text(), re.M).group(1)


def header(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))


def test_every_example_says_where_it_runs():
    assert len(EXAMPLES) >= 10
    for p in EXAMPLES:
        runs = re.search(r"^# Runs: (.*)$", p.read_text(), re.M)
        assert runs and ("on a cluster" in runs.group(1) or "on a laptop" in runs.group(1)), p
    assert {p.name for p in CLUSTER} >= {"tiny-judge.yaml", "autoscale.yaml", "qwen-gsm8k.yaml"}
    for p in EXAMPLES:  # what claims `kubectl apply` is marked for a cluster
        if re.search(r"^#\s+kubectl apply -f examples/", p.read_text(), re.M):
            assert p in CLUSTER, p


def test_the_image_recipe_builds_the_models_the_cluster_examples_name():
    assert built_in_image() == {"policy": {"/opt/grpojob/models/tiny", "/opt/grpojob/models/smollm2-135m-instruct"},
                                "judge": {"/opt/grpojob/models/tiny-reward"}}
    # and `grpojob run` makes the converted one from the same source where the image is not
    runs = " ".join(read_dockerfile(DOCKERFILES["runtime"])[-1].all("RUN"))
    for path, source in image_models.CONVERTED.items():
        assert f"grpojob model convert {source} --out {path}" in runs


def pods_and_models(path: Path) -> list[tuple[str, dict, str, str]]:
    """(pod owner's name, pod spec, model kind, model path) of each model a pod of the example loads."""
    job = parse(load_manifest(path))
    objs = {children.key(o): o for o in children.build(job, namespace="ml")}
    spec = json.loads(objs[("ConfigMap", n.config_name(job.metadata.name))]["data"][plan.CONFIG_FILE])["spec"]
    name = job.metadata.name
    out = []
    for kind, owner in (("StatefulSet", n.trainer_name(name)), ("Deployment", n.rollout_name(name))):
        pod = objs[(kind, owner)]["spec"]["template"]["spec"]
        out += [(owner, pod, "policy", p) for p in (spec["model"]["path"], spec["model"].get("tokenizer")) if p]
    for j in spec.get("judges") or ():
        owner = next(o["metadata"]["name"] for (k, nm), o in objs.items() if k == "Deployment"
                     and nm.endswith(f"-judge-{j['name']}"))
        out.append((owner, objs[("Deployment", owner)]["spec"]["template"]["spec"], "judge", j["model"]))
    return out


def on_a_named_claim(pod: dict, model: str, needs: str) -> bool:
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
              if "persistentVolumeClaim" in v}
    return any(model.startswith(m["mountPath"].rstrip("/") + "/") and m["name"] in claims
               and f"`{claims[m['name']]}`" in needs
               for c in pod["containers"] for m in c.get("volumeMounts", []))


@pytest.mark.parametrize("path", CLUSTER, ids=lambda p: p.name)
def test_each_cluster_examples_pods_find_their_models(path):
    image, built = n.runtime_image(None), built_in_image()
    found = pods_and_models(path)
    assert found and any(kind == "policy" for _, _, kind, _ in found)
    for owner, pod, kind, model in found:
        assert model.startswith("/"), f"{path.name}: {owner} loads {model!r}, a path relative to the pod's directory"
        assert all(c["image"] == image for c in pod["containers"]), "the default runtime image"
        assert model in built[kind] or on_a_named_claim(pod, model, header(path)), (
            f"{path.name}: {owner} loads the {kind} model {model}, which the runtime image does not build "
            f"(images/runtime/Dockerfile builds {sorted(built[kind])}) and no claim the example names holds")


def test_the_charts_notes_point_at_a_cluster_example():
    notes = (ROOT / "helm" / "grpojob" / "templates" / "NOTES.txt").read_text()
    named = set(re.findall(r"examples/[\w/.-]+\.yaml", notes))
    as_they_are = {f"examples/{p.relative_to(ROOT / 'examples')}" for p in CLUSTER if "needs" not in runs(p)}
    assert named & as_they_are, named


def test_grpojob_run_builds_the_images_models_where_it_runs(tmp_path, monkeypatch):
    """The same manifests under `grpojob run`: the image's paths, absent here, become local copies
    under .cache/image-models (with the build annotations; without them the path stays, and a
    missing model is reported as before)."""
    monkeypatch.chdir(tmp_path)
    doc = load_manifest(ROOT / "examples" / "tiny-judge.yaml")
    image_models.settle(doc)
    assert doc["spec"]["model"]["path"] == str(tmp_path / ".cache/image-models/tiny")
    assert doc["spec"]["judges"][0]["model"] == str(tmp_path / ".cache/image-models/tiny-reward")
    bare = load_manifest(ROOT / "examples" / "autoscale.yaml")
    del bare["metadata"]["annotations"]
    image_models.settle(bare)
    assert bare["spec"]["model"]["path"] == "/opt/grpojob/models/tiny"
