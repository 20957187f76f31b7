"""The Dockerfiles, read without a Docker engine (none here): what they copy exists and is in the
build context, the bases are pinned, they run as non-root, the entrypoints are real commands, the
pins agree with pyproject, and the chart, the Makefile and the operator's pod commands use them."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from grpojob import plan
from grpojob.api.spec import RENDEZVOUS_PORT, SYNC_STORE_PORT, RolloutSpec, TrainerSpec
from grpojob.cli import parser as cli_parser

from .conftest import CHART, ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = set(PYPROJECT["project"]["scripts"])
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
KNOWN = {"ARG", "FROM", "COPY", "RUN", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "EXPOSE", "LABEL"}


# --- a small Dockerfile reader -------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]

    def last(self, op: str) -> str | None:
        found = self.all(op)
        return found[-1] if found else None


def read_dockerfile(path: Path) -> list[Stage]:
    text = re.sub(r"\\\n", " ", path.read_text())  # line continuations
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, arg = line.partition(" ")
        op, arg = op.upper(), arg.strip()
        assert op in KNOWN, f"{path.name}: unexpected instruction {op}"
        if op == "ARG" and not stages:  # global ARGs parameterise FROM
            key, _, default = arg.partition("=")
            args[key] = default
        elif op == "FROM":
            words = [w for w in arg.split() if not w.startswith("--platform")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            stages[-1].instructions.append((op, arg))
    return stages


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)  # the exec (JSON) form: no shell between Docker and the process
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def copy_sources(arg: str) -> tuple[dict[str, str], list[str], str]:
    words = shlex.split(arg)
    flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    return flags, paths[:-1], paths[-1]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [ln.strip().lstrip("/") for ln in lines if ln.strip() and not ln.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: a path is out of the context when it or a parent matches the
    last matching pattern (a `!` pattern brings it back)."""
    def rx(p: str) -> re.Pattern:
        out = re.escape(p).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        return re.compile(out.replace(".*/", "(.*/)?"))
    parts = path.split("/")
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = rx(p[1:] if neg else p)
        if any(pat.fullmatch("/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            result = not neg
    return result


DOCKERFILES = {"operator": ROOT / "images" / "operator" / "Dockerfile",
               "runtime": ROOT / "images" / "runtime" / "Dockerfile"}


@pytest.fixture(scope="module", params=sorted(DOCKERFILES))
def image(request) -> tuple[str, list[Stage]]:
    return request.param, read_dockerfile(DOCKERFILES[request.param])


# --- the tests -----------------------------------------------------------------------------------

def test_dockerignore_reader():
    pats = ["**/__pycache__", ".venv", "tests", "*.egg-info", "!tests/keep"]
    assert ignored(".venv/lib/x.py", pats) and ignored("runtime/grpojob/__pycache__/a.pyc", pats)
    assert ignored("grpojob.egg-info/PKG-INFO", pats) and ignored("tests/chart/x.py", pats)
    assert not ignored("runtime/grpojob/cli.py", pats) and not ignored("tests/keep", pats)


def test_bases_are_pinned(image):
    name, stages = image
    names = {s.name for s in stages if s.name}
    for s in stages:
        if s.base in names:
            continue
        repo, _, tag = s.base.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), \
            f"{name}: base {s.base} is not pinned to a version"
    # Multi-stage: the final image takes only built results from the first stage.
    assert len(stages) >= 2 and stages[0].name
    assert any(copy_sources(a)[0].get("from") == stages[0].name for a in stages[-1].all("COPY"))


def test_copied_paths_exist_in_the_build_context(image):
    name, stages = image
    patterns = dockerignore_patterns()
    copied = []
    for s in stages:
        for arg in s.all("COPY"):
            flags, sources, _ = copy_sources(arg)
            if "from" in flags:
                assert flags["from"] in {t.name for t in stages}, f"{name}: unknown stage {flags['from']}"
                continue
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src}: no such path in the repository"
                assert not ignored(src, patterns), f"{name}: COPY {src} is excluded by .dockerignore"
                copied.append(src)
    # The package sources and what pyproject's build reads are all there.
    assert {"pyproject.toml", "README.md", "runtime", "operator"} <= set(copied)
    assert PYPROJECT["project"]["readme"] == "README.md"
    for src in ("runtime/grpojob/__init__.py", "runtime/grpojob/assets/corpus.txt"):
        assert not ignored(src, patterns), src


def test_dockerignore_keeps_the_context_small():
    patterns = dockerignore_patterns()
    for heavy in (".venv/bin/python", ".git/HEAD", ".cache/bin/helm", "runs/x/metrics.jsonl",
                  "runtime/grpojob/__pycache__/cli.cpython-311.pyc", "tests/api/test_spec.py"):
        assert ignored(heavy, patterns), heavy


def test_runs_as_a_non_root_user(image):
    name, stages = image
    user = stages[-1].last("USER")
    assert user, f"{name}: the final stage sets no USER"
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) >= 1000, f"{name}: USER {user} (numeric, so runAsNonRoot can check it)"
    assert not gid or int(gid) != 0
    if name == "operator":  # the chart's pod securityContext runs it as the same user
        assert int(uid) == VALUES["podSecurityContext"]["runAsUser"]
    if name == "runtime":  # the operator's trainer and rollout pods run as this user, $HOME an emptyDir
        names = pytest.importorskip("grpojob_operator.names")
        assert int(uid) == names.RUNTIME_UID
        env = dict(kv.split("=", 1) for arg in stages[-1].all("ENV") for kv in shlex.split(arg))
        assert env["HOME"] == names.HOME_DIR
        assert f"--home-dir {names.HOME_DIR}" in " ".join(stages[-1].all("RUN"))


def test_entrypoints_are_real_commands(image):
    name, stages = image
    final = stages[-1]
    entry = exec_form(final.last("ENTRYPOINT"))
    cmd = exec_form(final.last("CMD"))
    assert entry[0] in SCRIPTS, f"{name}: ENTRYPOINT {entry[0]} is not a console script in pyproject"
    args = cli_parser().parse_args(cmd) if cmd != ["--help"] else None
    if name == "operator":
        assert args.command == "operator"
        ports = {int(p) for e in final.all("EXPOSE") for p in e.split()}
        assert ports == {VALUES["metrics"]["port"], VALUES["health"]["port"]}
    else:
        # The operator's pod commands for the two roles run in this image: both executables exist
        # (grpojob is ours; `grpojob torchrun` runs torch's torchrun, which starts `python -m grpojob`).
        for command in (plan.trainer_command(), plan.rollout_command()):
            assert command[0] in SCRIPTS, command
        assert plan.trainer_command() == ["grpojob", "torchrun"]
        assert (ROOT / "runtime" / "grpojob" / "__main__.py").exists()
        ports = {int(p) for e in final.all("EXPOSE") for p in e.split()}
        assert ports == {TrainerSpec().port, RolloutSpec().port, RENDEZVOUS_PORT, SYNC_STORE_PORT}


def installed_extras(stages: list[Stage]) -> set[str]:
    extras = set()
    for s in stages:
        for run in s.all("RUN"):
            for m in re.finditer(r"pip install[^&]*?[\"']?[^\s\"']*\[([a-z,-]+)\]", run):
                extras.update(m.group(1).split(","))
    return extras


def test_each_image_installs_its_extras(image):
    name, stages = image
    extras = installed_extras(stages)
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    if name == "operator":
        assert extras == {"operator"}  # no torch in the operator image
        closure = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"]
        assert not any(Requirement(r).name in ("torch", "vllm", "transformers") for r in closure)
    else:
        # tinker: a service-mode trainer serves Tinker's wire with the SDK's own types (grpojob.service.tinker_api)
        # gguf: spec.model.path naming a GGUF file, and the image's own converted model
        # reasoning-gym: the built-in dataset and reward of that name (examples/smollm2-reasoning-cluster.yaml)
        assert extras == {"runtime", "vllm", "trackers", "tinker", "gguf", "reasoning-gym"}
        run = " ".join(stages[-1].all("RUN"))
        tiny = re.search(r"grpojob tiny (\S+)", run)  # the model the chart's NOTES first job uses
        assert tiny and tiny.group(1) == "/opt/grpojob/models/tiny"
        assert cli_parser().parse_args(["tiny", tiny.group(1)]).command == "tiny"


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_runtime_image_installs_what_every_report_to_value_imports():
    """spec.monitoring.reportTo in a pod: each value's tracker imports a package (TRACKER_MODULES);
    the distribution that provides it (as installed here, e.g. mlflow from mlflow-skinny) must be
    required by an extra the runtime image installs, or the trainer crashes at its first step."""
    import importlib.metadata
    import typing

    from grpojob.api.operations import TRACKERS, MonitoringSpec
    from grpojob.leader.callbacks import TRACKER_MODULES

    values = typing.get_args(typing.get_args(MonitoringSpec.model_fields["report_to"].annotation)[0])
    assert set(values) == set(TRACKERS) == set(TRACKER_MODULES)
    extras = installed_extras(read_dockerfile(DOCKERFILES["runtime"]))
    required = {_dist(Requirement(r).name) for e in sorted(extras)
                for r in PYPROJECT["project"]["optional-dependencies"][e]}
    providers = importlib.metadata.packages_distributions()
    for value in values:
        module = TRACKER_MODULES[value]
        found = {_dist(d) for d in providers.get(module, [])}
        assert found, f"reportTo {value}: '{module}' is not installed here to look up its distribution"
        assert found & required, (f"reportTo {value} imports '{module}' ({', '.join(sorted(found))}), which no extra "
                                  f"the runtime image installs ({', '.join(sorted(extras))}) requires")


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line} is not pinned with =="
            out[Requirement(name).name.lower().replace("_", "-")] = version
    return out


def _reqs(names: list[str]) -> dict[str, Requirement]:
    return {Requirement(r).name.lower().replace("_", "-"): Requirement(r) for r in names}


def test_operator_pins_cover_and_satisfy_pyproject():
    constraints = pins(ROOT / "images" / "operator" / "constraints.txt")
    wanted = _reqs(PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["operator"])
    for name, req in wanted.items():
        assert name in constraints, f"images/operator/constraints.txt does not pin {name}"
        assert req.specifier.contains(constraints[name]), f"{name}=={constraints[name]} breaks {req}"


def test_runtime_pins_satisfy_pyproject_and_are_excluded_from_the_base_pins():
    constraints = pins(ROOT / "images" / "runtime" / "constraints.txt")
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = _reqs(extras["runtime"] + extras["tinker"] + extras["gguf"] + extras["reasoning-gym"])  # not in the base image
    for name, version in constraints.items():
        assert name in wanted and wanted[name].specifier.contains(version), f"{name}=={version}"
    # The Dockerfile drops these names from the base image's freeze, or pip sees two pins.
    run = " ".join(read_dockerfile(DOCKERFILES["runtime"])[-1].all("RUN"))
    m = re.search(r"grep -viE '\^\(([^)]*)\)=='", run)
    assert m and set(m.group(1).split("|")) == set(constraints)


def test_make_images_builds_the_images_the_chart_deploys(render):
    out = subprocess.run(["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    builds = {}
    for line in out.stdout.splitlines():
        words = shlex.split(line)
        if words[1:2] == ["build"]:
            builds[words[words.index("-f") + 1]] = words[words.index("-t") + 1]
            assert words[-1] == ".", "the build context is the repository root (.dockerignore)"
    objs = render()
    (container,) = [o for o in objs if o["kind"] == "Deployment"][0]["spec"]["template"]["spec"]["containers"]
    runtime = {e["name"]: e.get("value") for e in container["env"]}["GRPOJOB_RUNTIME_IMAGE"]
    assert builds == {"images/operator/Dockerfile": container["image"], "images/runtime/Dockerfile": runtime}


def test_make_targets_the_docs_name():
    out = subprocess.run(["make", "-n", "test", "crd", "chart-lint", "images"], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "bash .ci/run" in out.stdout
    assert "grpojob crd -o crds/grpojob.yaml" in out.stdout and "helm/grpojob/crds/grpojob.yaml" in out.stdout
    assert "lint --strict helm/grpojob" in out.stdout
    docs = (ROOT / "docs" / "helm.md").read_text()
    for target in ("make crd", "make chart-lint", "make images", "make test"):
        assert target in docs, f"docs/helm.md does not mention `{target}`"
