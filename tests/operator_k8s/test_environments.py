"""spec.environments on a cluster: a Deployment per environment rendered from the same plan as
`grpojob run` (the rollout Service's OpenAI URL and the trajectory API's URL in its environment),
with the pod security of the other roles; the real operator creates them, PodSecurity (acted out)
admits their pods, suspend stops them; and their pods, run as rendered (tests/helpers/pod_sandbox),
train a job from the example environment."""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from grpojob import auth, plan
from grpojob.api import parse
from grpojob.local.processes import free_port
from grpojob.local.runner import _children
from grpojob_operator import children
from grpojob_operator import names as n
from grpojob_operator.pods import CACHE_ENV
from grpojob_operator.rbac import allows
from tests.helpers import pod_sandbox, statefulset
from tests.helpers.k8s_schema import validate_all
from tests.helpers.pod_security import restricted

from .cluster import eventually
from .conftest import NS, PER_POD, job_manifest, job_path
from .kmock_shim import DEPLOYMENTS, GRPOJOBS, PODS
from .test_children import OWNER, build, container, env_of
from .test_pod_sandbox import wait_completed
from .test_operator import cond, kids, status, without_server_fields

pytestmark = pytest.mark.serial  # its slow tests are timing-sensitive: CI runs them alone

ROOT = Path(__file__).resolve().parents[2]
ENVS = [
    {"name": "arith", "command": ["python", "-m", "arith_env"], "replicas": 2,
     "image": "me/envs:1", "imagePullPolicy": "Always",
     "resources": {"requests": {"cpu": "500m", "memory": 1}, "limits": {"memory": "1Gi"}},
     "env": [{"name": "LEVEL", "value": "3"},
             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "env", "key": "token"}}},
             {"name": plan.ENV_OPENAI_API_KEY, "value": "mine"}],
     "nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "spot", "operator": "Exists"}],
     "serviceAccountName": "envs", "labels": {"team": "rl", n.LABEL_ROLE: "hijack"}, "annotations": {"a": "b"}},
    {"name": "code", "command": ["code-env", "--fast"]},
]


def env_job(name="j", **over):
    return job_manifest(name, model={"path": "/models/m", "volumeClaim": "models"}, environments=copy.deepcopy(ENVS),
                        **over)


def test_each_environment_gets_a_deployment_from_the_plan():
    kids_ = build(env_job())
    assert list(kids_)[-2:] == [("Deployment", "j-env-arith"), ("Deployment", "j-env-code")]
    assert validate_all(kids_.values()) == 9  # kubernetes-validate --strict, every child (2 NetworkPolicies)
    arith, code = kids_[("Deployment", "j-env-arith")], kids_[("Deployment", "j-env-code")]
    for dep, env in ((arith, "arith"), (code, "code")):
        assert dep["metadata"]["ownerReferences"] == [OWNER]
        assert dep["metadata"]["labels"][n.LABEL_ENVIRONMENT] == env
        assert dep["metadata"]["labels"][n.LABEL_COMPONENT] == "environment"
        sel = dep["spec"]["selector"]["matchLabels"]
        assert sel == {n.LABEL_JOB: "j", n.LABEL_ROLE: "environment", n.LABEL_ENVIRONMENT: env}
        assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        pod = dep["spec"]["template"]["spec"]
        assert restricted(pod) == []  # PodSecurity restricted, as the trainer's and rollouts' pods
        c = container(dep)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True and "readinessProbe" not in c
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts == {"/etc/grpojob": "grpojob-config", "/var/run/grpojob": "grpojob-run",
                          "/dev/shm": "grpojob-shm", "/home/grpojob": "grpojob-home", "/tmp": "grpojob-tmp",
                          "/var/run/secrets/grpojob": "grpojob-token"}  # the job's token, read-only
        e = env_of(c)  # the plan's environment: where the rollout servers and the trajectory API are
        assert e[plan.ENV_OPENAI_BASE_URL] == e[plan.ENV_OPENAI_BASE_URLS] == "http://j-rollout.ml.svc:8000/v1"
        assert e[plan.ENV_TRAJECTORY_URL] == "http://j-trainer-0.j-trainer.ml.svc:9400/trajectories"
        assert e[plan.ENV_ENVIRONMENT] == env and e[plan.ENV_ROLE] == "environment"
        assert e[plan.ENV_REPLICA_ID] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert e[plan.ENV_CONFIG] == "/etc/grpojob/grpojob.json" and plan.ENV_SYNC_ADDR not in e
    # The trajectory URL names the trainer's http port, which its headless Service serves.
    assert {p["name"]: p["port"] for p in kids_[("Service", "j-trainer")]["spec"]["ports"]}["http"] == 9400

    c, pod = container(arith), arith["spec"]["template"]
    assert arith["spec"]["replicas"] == 2 and code["spec"]["replicas"] == 1
    assert c["command"] == ["python", "-m", "arith_env"] and container(code)["command"] == ["code-env", "--fast"]
    assert c["image"] == "me/envs:1" and c["imagePullPolicy"] == "Always"
    assert container(code)["image"] == n.runtime_image()
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "1"}, "limits": {"memory": "1Gi"}}
    e = env_of(c)
    assert e["LEVEL"] == "3" and e["TOKEN"] == {"secretKeyRef": {"name": "env", "key": "token"}}
    assert e[plan.ENV_OPENAI_API_KEY] == "mine"  # the user's variable replaces the plan's
    # Without one, the OpenAI key is the job's token, from its Secret (never a literal value).
    assert env_of(container(code))[plan.ENV_OPENAI_API_KEY] == {"secretKeyRef": {"name": "j-token", "key": "token"}}
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"} and pod["spec"]["serviceAccountName"] == "envs"
    assert pod["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert pod["metadata"]["labels"]["team"] == "rl" and pod["metadata"]["labels"][n.LABEL_ROLE] == "environment"
    assert pod["metadata"]["annotations"] == {"a": "b"}


def test_environments_run_while_the_trainer_does():
    down = build(env_job(), scale=children.Scale(0, 0))
    assert down[("Deployment", "j-env-arith")]["spec"]["replicas"] == 0
    # Rollouts scaled to zero alone (not a state the operator makes, but the rule is the trainer's).
    assert build(env_job(), scale=children.Scale(2, 0))[("Deployment", "j-env-arith")]["spec"]["replicas"] == 2
    assert not any(k[1].startswith("j-env-") for k in build(job_manifest("j")))


def test_grpojob_run_starts_the_same_environment_processes(tmp_path):
    """The operator's container and the local child come from one plan: same command, same
    variables (values differ only where the placement does: addresses and paths)."""
    m = job_manifest("j", environments=[{"name": "arith", "command": ["python", "-c", "pass"],
                                         "env": [{"name": "LEVEL", "value": "3"}]}])
    job = parse(m)
    local = {c.name: c for c in _children(job, tmp_path, None)}
    child = local["env-arith-0"]
    c = container(build(m)[("Deployment", "j-env-arith")])
    assert child.argv[1:] == c["command"][1:] and Path(child.argv[0]).name.startswith("python")
    assert {e["name"] for e in c["env"]} - set(CACHE_ENV) <= set(child.env)
    rollout = local["rollout-0"].env[plan.ENV_ROLLOUT_PORT]
    assert child.env[plan.ENV_OPENAI_BASE_URL] == f"http://127.0.0.1:{rollout}/v1"
    assert child.env[plan.ENV_TRAJECTORY_URL] == \
        f"http://127.0.0.1:{local['trainer-0'].env[plan.ENV_TRAINER_PORT]}/trajectories"
    assert child.env["LEVEL"] == "3" and child.env[plan.ENV_REPLICA_ID] == "env-arith-0"


async def test_the_operator_creates_environment_deployments_and_suspend_stops_them(emulator, cluster, operator,
                                                                                   trainer):
    await cluster.create(job_path(), env_job("envs"))
    await eventually(lambda: cond(emulator, "envs", "Created").get("status") == "True", what="Created")
    uid = emulator.get_obj(GRPOJOBS, NS, "envs")["metadata"]["uid"]
    expected = children.build(parse(env_job("envs")), namespace=NS, image=operator.cfg.image,
                              owner=children.owner_reference("envs", uid))
    have = kids(emulator, "envs")
    assert sorted(have) == sorted(children.key(o) for o in expected)
    for obj in expected:
        assert without_server_fields(have[children.key(obj)]) == obj, children.key(obj)

    # The acted-out Deployment controller makes their pods; acted-out PodSecurity admits them.
    envs = lambda: [p for p in cluster.pods(NS, "envs", "environment")]  # noqa: E731
    await eventually(lambda: len(envs()) == 3, what="environment pods admitted")
    trainer.set(NS, "envs", phase="running", totalSteps=20)
    await cluster.run_pods(NS, "envs")
    await eventually(lambda: status(emulator, "envs").get("phase") == "Running", what="Running")
    assert status(emulator, "envs")["rollout"] == {"desired": 2, "ready": 2}  # environments are not rollouts

    await cluster.patch(job_path(NS, "envs"), {"spec": {"runPolicy": {"suspend": True}}})
    await eventually(lambda: ("ml", "envs") in trainer.suspends, what="POST /suspend")
    trainer.set(NS, "envs", phase="suspended", lastCheckpointStep=3)
    await eventually(lambda: emulator.get_obj(DEPLOYMENTS, NS, "envs-env-arith")["spec"]["replicas"] == 0,
                     what="environments scaled to zero")
    await eventually(lambda: not envs(), what="environment pods gone")

    used = set()  # every request the operator made is covered by the chart's RBAC rules
    verbs = {"list": "list", "watch": "watch", "fetch": "get", "create": "create", "update": "patch",
             "delete": "delete"}
    for r in list(emulator._requests):
        if r.resource is None or r.resource.plural is None or r.action is None \
                or r.headers.get("User-Agent", "").startswith("kmock/"):
            continue
        used.add((r.resource.group, r.resource.plural + (f"/{r.subresource}" if r.subresource else ""),
                  verbs[r.action.value.lower()]))
    assert ("apps", "deployments", "create") in used and ("apps", "deployments", "patch") in used
    assert [u for u in used if not allows(*u)] == []
    assert not [p for p in emulator.live(PODS, NS) if p["metadata"]["labels"].get(n.LABEL_ROLE) == "environment"]


ok, why = pod_sandbox.available()


def _index_env() -> dict[str, str]:
    """The package index as this machine reaches it (pip's and uv's settings, its CA bundle): what
    a cluster's pods get from their network and image."""
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("PIP_", "UV_")) or k in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")}
    user = Path.home() / ".config" / "pip" / "pip.conf"  # the pod's HOME is another directory
    if "PIP_CONFIG_FILE" not in env and user.is_file():
        env["PIP_CONFIG_FILE"] = str(user)
    return env


def _train_in_pods(tmp_path: Path, model_dir: Path, example: str, name: str, sampling: Optional[dict] = None,
                   command: Optional[list[str]] = None, pip: Optional[dict] = None,
                   **spec) -> tuple[list[dict], dict]:
    """Trainer, rollout and environment pods of a job as rendered (read-only root, uid 10001, no
    capabilities), run in the pod sandbox until the trainer completes. The example environment
    `examples/environments/<example>.py` (or the package folder `<example>/`) is brought in by
    spec.code (a claim; the runtime image does not ship examples) and started as a module from the
    PYTHONPATH its pod gets (or by `command`). `pip`: spec.code's `pip` and `pipArgs`, installed by
    the environment pod's install-code init container, run before its main container. Returns the
    trainer's metrics.jsonl rows and each pod's log."""
    models, code = tmp_path / "models", tmp_path / "code"
    shutil.copytree(model_dir, models / "tiny")
    code.mkdir()
    module = Path(example).name
    source = ROOT / "examples" / "environments" / example
    if source.is_dir():
        shutil.copytree(source, code / module, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy(source.with_suffix(".py"), code / f"{module}.py")
    for p in [models, code, *models.rglob("*"), *code.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    ckpt = tmp_path / "checkpoints"  # trainer pod 0's claim, as the kubelet hands it over under fsGroup
    ckpt.mkdir()
    os.chown(ckpt, 0, n.RUNTIME_UID)
    ckpt.chmod(0o2775)
    trainer_port, rollout_port = free_port(), free_port()
    rollout = {"replicas": 1, "backend": "hf", "port": rollout_port, "workflow": "none",
               "sampling": sampling or {"maxTokens": 4}}
    m = job_manifest("t", model={"path": "/models/tiny", "volumeClaim": "models"},
                     trainer={"replicas": 1, "processesPerReplica": 1, "port": trainer_port},
                     rollout=rollout, checkpoint={**PER_POD, "everySteps": 100},
                     code={"volume": {"name": "envcode", "persistentVolumeClaim": {"claimName": "code",
                                                                                   "readOnly": True}},
                           **(pip or {})},
                     environments=[{"name": name, "command": command or ["python", "-m", module]}], **spec)
    del m["spec"]["dataset"], m["spec"]["rewards"]  # environments bring both
    kids_ = {children.key(o): o for o in children.build(parse(m), namespace="ml")}
    config = kids_[("ConfigMap", "t-config")]["data"]
    # The cluster network, acted out: every Service name is this machine.
    network = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()),
               plan.ENV_SYNC_ADDR: f"127.0.0.1:{free_port()}",
               plan.ENV_OPENAI_BASE_URL: f"http://127.0.0.1:{rollout_port}/v1",
               plan.ENV_OPENAI_BASE_URLS: f"http://127.0.0.1:{rollout_port}/v1",
               plan.ENV_TRAJECTORY_URL: f"http://127.0.0.1:{trainer_port}/trajectories"}
    secrets = {n.token_name("t"): {auth.TOKEN_KEY: auth.generate()}}  # what the operator puts in the Secret
    sts = kids_[("StatefulSet", "t-trainer")]
    claims = {"models": models, "code": code, statefulset.claims(sts, 0)[0]["metadata"]["name"]: ckpt}
    procs = {}
    for role, key in (("rollout", ("Deployment", "t-rollout")), ("trainer", ("StatefulSet", "t-trainer")),
                      ("env", ("Deployment", f"t-env-{name}"))):
        pod = statefulset.pod_spec(sts, 0) if role == "trainer" else copy.deepcopy(kids_[key]["spec"]["template"]["spec"])
        work = tmp_path / role
        work.mkdir()
        overrides = network
        if role == "env" and pod.get("initContainers"):
            # The init container (`grpojob install-code`: spec.code.pip into the site dir, an emptyDir
            # of the pod) runs to completion first, on the pod's volumes, while trainer and rollout start.
            # Their pods would install the same packages, which they never import: skipped (CI time).
            overrides = {**network, **_index_env()}
            init = tmp_path / "env-init"
            init.mkdir()
            started = time.monotonic()
            proc = pod_sandbox.start({**pod, "containers": pod["initContainers"]}, init, pod_name="t-env-0",
                                     config=config, claims=claims, overrides=overrides, secrets=secrets,
                                     log=init / "log", volumes_dir=work / "volumes")
            assert proc.wait(300) == 0, (init / "log").read_text()[-3000:]
            print(f"install-code: {time.monotonic() - started:.0f} s")
        procs[role] = (pod_sandbox.start(pod, work, pod_name=f"t-{role}-0", config=config, claims=claims,
                                         overrides=overrides, secrets=secrets, log=work / "log"), work)
    try:
        (trainer, twork), (rollout_proc, rwork), (env, ework) = procs["trainer"], procs["rollout"], procs["env"]
        done = wait_completed(trainer_port, secrets[n.token_name("t")][auth.TOKEN_KEY],
                              [trainer, rollout_proc, env], [twork / "log", rwork / "log", ework / "log"])
        assert done["step"] == m["spec"]["training"]["steps"]
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 15)
                p.wait(30)
        logs = {r: (w / "log").read_text() for r, (_, w) in procs.items()}
    for text in logs.values():
        assert "Read-only file system" not in text and "Permission denied" not in text
    records = [json.loads(x) for x in (twork / "volumes" / "grpojob-run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") is None], logs


@pytest.mark.slow
@pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")
def test_environment_pods_train_a_job_under_the_restricted_pod_security(tiny_dir, tmp_path):
    """The arithmetic environment reaches the rollout server and the trajectory API through the
    addresses the plan gave it, and the trainer trains on its groups alone."""
    records, logs = _train_in_pods(tmp_path, tiny_dir, "arithmetic", "arith", algorithm={"maxStaleness": 1},
                                   training={"steps": 3, "promptsPerStep": 4, "microBatchTokens": 1024})
    assert '"event": "registered"' in logs["env"] and '"event": "submitted"' in logs["env"]
    assert [r["groups_from_environments"] for r in records] == [4, 4, 4]
    assert set(records[-1]["rewards"]) == {"number", "correct"}


@pytest.mark.slow
@pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")
def test_the_calculator_agents_sessions_train_the_job_in_pods(tmp_path):
    """examples/environments/calculator.yaml's job in pods: the agent, a plain OpenAI client with a
    tool, talks to the rollout Service with X-Session-Id; the rollout pod records each session's
    tokens on the trainer pod's trajectory API (GRPOJOB_TRAJECTORY_URL, the job's token), and the
    trainer trains on those sessions alone, step after step. That the policy learns from them is
    tests/local/test_agents.py's run (the same processes under grpojob run, 60 steps): here a few
    steps show the pods' wiring, so the suite does not train the same agent twice (CI time)."""
    import yaml

    from grpojob.tiny import build

    example = yaml.safe_load((ROOT / "examples" / "environments" / "calculator.yaml").read_text())["spec"]
    model = build(tmp_path / "src" / "tiny-tools", tools=True)
    steps = 6
    records, logs = _train_in_pods(tmp_path, model, "calculator", "calculator",
                                   algorithm=example["algorithm"], training={**example["training"], "steps": steps},
                                   sampling=example["rollout"]["sampling"])
    pps, turn_tokens = example["training"]["promptsPerStep"], example["rollout"]["sampling"]["maxTokens"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every group is the agent's sessions; two turns trained, the context between not
        assert r["environments"]["calculator"]["groups"] == pps and r["groups_from_environments"] == pps
        assert set(r["rewards"]) == {"call", "parsed", "correct"}
        assert r["trained_tokens"] <= 2 * turn_tokens * pps * example["algorithm"]["groupSize"]
        assert r["completion_length_mean"] > 2 * turn_tokens + 10
    assert any(r["trained_tokens"] > 0 for r in records)  # groups whose sessions' rewards differ, trained on
    episodes = [json.loads(x) for x in logs["env"].splitlines() if x.startswith("{")]
    assert sum(e["sessions"] for e in episodes if e["event"] == "episodes") >= steps * pps * example["algorithm"]["groupSize"]


@pytest.mark.slow
@pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")
def test_an_atropos_environment_trains_the_job_in_pods(tiny_dir, tmp_path):
    """examples/environments/atropos/words_env.py, an unchanged atroposlib BaseEnv, in its pod with
    its own `serve` CLI (`python -m grpojob.integrations.atropos -m words_env serve`): the pod has
    no model files, so the launcher takes the tokenizer from the rollout pod (GET /vllm/tokenizer);
    the environment samples through the rollout Service's /vllm/generate and posts ScoredData to
    the trainer pod's run-api routes (the token in the path); every step trains on its groups and
    the reward rises (measured 0.03 -> 0.55 and 0.04 -> 0.69, first and last 3 steps, 73-96 s)."""
    pytest.importorskip("atroposlib", reason="atroposlib (the environments set)")
    steps, pps = 20, 8  # at 14 steps the rise (it takes off around step 11) was 0.13-0.31 over 4 runs
    records, logs = _train_in_pods(
        tmp_path, tiny_dir, "atropos/words_env", "words",
        command=["python", "-m", "grpojob.integrations.atropos", "-m", "words_env", "serve"],
        algorithm={"groupSize": 8, "maxStaleness": 1},
        training={"steps": steps, "promptsPerStep": pps, "learningRate": 0.01, "microBatchTokens": 2048})
    assert "the rollout servers' tokenizer files in /tmp/grpojob-tokenizer-" in logs["env"], logs["env"][-2000:]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert r["groups_from_environments"] == pps and r["environments"]["atropos-words"]["groups"] == pps
    rewards = [r["reward_mean"] for r in records]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"reward {[round(x, 2) for x in rewards]}")
    assert last >= first + 0.2, f"reward {first:.3f} -> {last:.3f}: {rewards}"


# the environments set's verifiers 0.4 venv (.ci/sets/environments.sh): its pods need the same index
VERIFIERS4 = Path(os.environ.get("GRPOJOB_TEST_VERIFIERS4_PYTHON", f"{sys.prefix}-verifiers4/bin/python"))


@pytest.mark.slow
@pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")
@pytest.mark.skipif(not VERIFIERS4.exists(), reason=f"the environments set (no verifiers 0.4 venv at {VERIFIERS4}): "
                                                     "its pods install verifiers from the index")
def test_a_verifiers_environment_trains_the_job_in_pods(tiny_dir, tmp_path):
    """examples/environments/verifiers/words-cluster.yaml's environment in its pod: the runtime
    image's Python (no verifiers in it) with spec.code.pip (verifiers 0.4, uv and what verifiers
    imports beyond the image, --no-deps) installed by the pod's install-code init container into
    its site dir, words_taskset from the code volume; the driver finds uv there, verifiers' chat
    program (a uv script per rollout, its packages synced from the index into the pod's $HOME)
    streams each turn to the rollout Service with X-Session-ID, and the trainer pod trains on those
    sessions alone. A few steps show the pods' wiring (each rollout is a process of its own:
    docs/environments.md has the measurements)."""
    import re

    import yaml

    example = yaml.safe_load((ROOT / "examples/environments/verifiers/words-cluster.yaml").read_text())["spec"]
    code = {"pip": example["code"]["pip"], "pipArgs": example["code"]["pipArgs"]}
    (env,) = example["environments"]
    steps, pps = 2, 2
    records, logs = _train_in_pods(
        tmp_path, tiny_dir, "verifiers/words_taskset", "words", command=env["command"], pip=code,
        sampling=example["rollout"]["sampling"], algorithm={"groupSize": 2, "maxStaleness": 1},
        training={"steps": steps, "promptsPerStep": pps, "learningRate": 0.006, "microBatchTokens": 2048})
    # verifiers imported from the site dir, uv found there (the driver's first line)
    assert re.search(rf"verifiers 0\.4\.\d+ from {n.SITE_DIR}, uv {n.SITE_DIR}/bin/uv\n", logs["env"]), \
        logs["env"][-3000:]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        assert r["groups_from_environments"] == pps and r["environments"]["words"]["groups"] == pps
    assert logs["env"].count("rollout done:") >= steps * pps * 2
