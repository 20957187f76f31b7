"""verifiers v1 (0.4) environments, unchanged: examples/environments/verifiers/words_taskset (a
verifiers Taskset, no grpojob import) loaded with `vf.load_environment(vf.resolve_env_config(...))`,
its slots run with `env.run_slot` under `env.serving()` on the subprocess runtime (each rollout is
verifiers' own chat program, a uv script), verifiers' eval client streaming to the rollout servers
with X-Session-ID. In a venv of its own (openai < 3, mcp 2.0): .ci/sets/environments.sh."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.rollout.harness import TOKEN, http, load_model
from tests.trajectories.test_sessions_server import stack  # noqa: F401 - a rollout server + the trajectory API

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "environments" / "verifiers"
# CI's environments set makes it beside its own venv (.ci/sets/environments.sh)
PYTHON = os.environ.get("GRPOJOB_TEST_VERIFIERS4_PYTHON", f"{sys.prefix}-verifiers4/bin/python")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(PYTHON).exists(),
                                 reason=f"no verifiers 0.4 venv at {PYTHON} (GRPOJOB_TEST_VERIFIERS4_PYTHON)")]

NULL_HARNESS = {"agent": {"harness": {"id": "null"}}}  # verifiers' plain chat program (no tools)


def driver_env(tmp_path, base: str, api: str, **extra) -> dict:
    (tmp_path / "token").write_text(TOKEN)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'runtime'}{os.pathsep}{EXAMPLE}", "OPENAI_BASE_URL": base,
           "GRPOJOB_TRAJECTORY_URL": api, "GRPOJOB_TOKEN_FILE": str(tmp_path / "token"),
           "GRPOJOB_ENVIRONMENT": "vf-words", "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}",
           **extra}
    env.pop("GRPOJOB_CONFIG", None)
    return env


# verifiers' null harness (its chat program, a process per rollout) and examples/environments/verifiers/
# inprocess_chat.py (a harness of one's own that makes the same call in the driver's process)
@pytest.mark.parametrize("harness", ["null", "inprocess_chat"])
def test_verifiers_slots_become_an_exact_group(stack, tmp_path, tokenizer, harness):  # noqa: F811
    srv, manager = stack["srv"], stack["manager"]
    proc = subprocess.run([PYTHON, "-m", "grpojob.integrations.verifiers", "--taskset", "words_taskset",
                           "--env-config", json.dumps({"agent": {"harness": {"id": harness}}}),
                           "--group-size", "2", "--groups", "1",
                           "--tasks", "1"],
                          capture_output=True, text=True, timeout=300, env=driver_env(tmp_path, srv.url + "/v1",
                                                                                      stack["api"]))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (group,) = manager.next_step().groups
    assert group.sample.row["environment"] == "vf-words" and len(group.completions) == 2
    assert "name animals" in tokenizer.decode(group.completions[0].prompt_ids)  # the taskset's prompt
    model = load_model(stack["model"])
    for c in group.completions:
        status, out = http(srv.url + "/vllm/versions", {"sequences": [c.prompt_ids + c.completion_ids]})
        assert status == 200 and out["versions"] == [[0] * len(c.completion_ids)]  # exactly as served
        with torch.no_grad():
            logits = model(torch.tensor([c.prompt_ids + c.completion_ids])).logits[0, len(c.prompt_ids) - 1:-1]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.completion_ids)[:, None]).squeeze(-1)
        assert c.logprobs == pytest.approx(ref.tolist(), abs=1e-3)  # the policy's own, at temperature 1


def test_agent_seats_run_on_the_subprocess_runtime_unless_the_config_names_one(tmp_path):
    code = ("import json; from grpojob.integrations.verifiers_v1 import env_config as c; "
            "print(json.dumps([c({'agent': {'harness': {'id': 'null'}}}, 'words_taskset').agent.runtime.type, "
            "c({'agent': {'runtime': {'type': 'docker'}}}, 'words_taskset').agent.runtime.type]))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                         env=driver_env(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/trajectories"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["subprocess", "docker"]  # verifiers' default: prime

def test_a_missing_uv_is_refused_with_the_fix(tmp_path):
    env = driver_env(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/trajectories", PATH="/usr/bin:/bin")
    env.pop("GRPOJOB_SITE_DIR", None)
    proc = subprocess.run([PYTHON, "-m", "grpojob.integrations.verifiers", "--taskset", "words_taskset",
                           "--env-config", json.dumps(NULL_HARNESS)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode != 0 and "`uv` is not on PATH" in proc.stderr and "spec.code.pip" in proc.stderr
    # where spec.code.pip installs it (the install-code init container's site dir), it is found
    (tmp_path / "site" / "bin").mkdir(parents=True)
    (tmp_path / "site" / "bin" / "uv").symlink_to(Path(PYTHON).parent / "uv")
    found = subprocess.run([PYTHON, "-c", "from grpojob.integrations.verifiers_v1 import find_uv; print(find_uv())"],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "GRPOJOB_SITE_DIR": str(tmp_path / "site")})
    assert found.stdout.strip() == str(tmp_path / "site" / "bin" / "uv"), found.stderr



PROBE = """
import asyncio, json, sys, importlib.metadata as m
import verifiers.v1 as vf
from grpojob.integrations.verifiers_v1 import env_config
env = vf.load_environment(env_config(json.loads(sys.argv[1]), "words_taskset"))
async def serve():
    async with env.serving():  # the interception server's imports
        pass
asyncio.run(serve())
d = m.packages_distributions()
print(json.dumps({x: m.version(x) for k in list(sys.modules) for x in d.get(k.split('.')[0], [])}))
"""


def test_the_cluster_example_brings_what_the_environment_imports(tmp_path):
    """examples/environments/verifiers/words-cluster.yaml: spec.code.pip (--no-deps) is exactly what
    the driver, `verifiers.v1`, loading the taskset and `env.serving()` import beyond the runtime
    image (its extras and vLLM's openai with its requirements), plus uv (a program, not imported);
    the versions it allows are the ones this venv has. Its pods: tests/operator_k8s/test_environments.py."""
    from packaging.requirements import Requirement

    from grpojob.api import load_manifest, parse
    from tests.integrations.test_atropos_launch import IMAGE_EXTRAS, _norm, _required

    job = parse(load_manifest(EXAMPLE / "words-cluster.yaml"))
    (env,) = job.spec.environments
    assert env.command[:5] == ["python", "-m", "grpojob.integrations.verifiers", "--taskset", "words_taskset"]
    out = subprocess.run([PYTHON, "-c", PROBE, env.command[-1]], capture_output=True, text=True, timeout=300,
                         env=driver_env(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/trajectories"))
    assert out.returncode == 0, out.stderr[-2000:]
    versions = {_norm(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    image = {n for n, _ in _required("grpojob", IMAGE_EXTRAS) | _required("openai")}
    pip = {_norm(Requirement(r).name): Requirement(r) for r in job.spec.code.pip}
    assert job.spec.code.pip_args == ["--no-deps"]
    assert set(pip) == (set(versions) - image) | {"uv"}
    versions["uv"] = subprocess.run([str(Path(PYTHON).parent / "uv"), "--version"], capture_output=True,
                                    text=True).stdout.split()[1]
    for name, req in pip.items():
        assert req.specifier.contains(versions[name]), f"{req} does not allow the {name} {versions[name]} tested"


def test_the_reward_rises_through_grpojob_run(tmp_path):
    """examples/environments/verifiers/words.yaml end to end (trainer, rollout server, the driver in
    verifiers 0.4's venv), with two changes for speed: the harness is inprocess_chat.py (one chat
    call in the driver's process; the null harness's process per rollout costs about 4 s of CPU)
    and two driver replicas play groups at once (each plays its groups one by one). Measured on 2
    shared cores: see docs/environments.md."""
    import yaml

    from grpojob.local.progress import read_records

    doc = yaml.safe_load((EXAMPLE / "words.yaml").read_text())
    s = doc["spec"]
    (env,) = s["environments"]
    env["command"] = [PYTHON, *env["command"][1:-1], json.dumps({"agent": {"harness": {"id": "inprocess_chat"}}})]
    env["replicas"] = 2
    env["env"] = [{"name": "PYTHONPATH", "value": f"{ROOT / 'runtime'}{os.pathsep}{EXAMPLE}"},
                  {"name": "PATH", "value": f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}"}]
    s["code"]["localPath"] = str(EXAMPLE)
    s["model"]["path"] = str(tmp_path / "tiny-model")
    s["algorithm"]["groupSize"] = 8
    steps = 24
    s["training"].update(steps=steps, promptsPerStep=4, learningRate=0.01)
    (tmp_path / "words.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(tmp_path / "words.yaml"), "--run-dir",
                           str(tmp_path / "run"), "--no-progress"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["environments"]["words"]["groups"] == 4 for r in records)
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"reward {[round(x, 3) for x in rewards]}; steps {records[0]['time']:.0f}-{records[-1]['time']:.0f}")
    assert last >= first + 0.2, f"reward {first:.3f} -> {last:.3f}: {rewards}"  # measured 0.03 -> 0.50, 0.05 -> 0.60
