"""Issue 35's Done-when, in the pod sandbox: a job with a reward model and no rule-based reward,
its trainer, rollout and judge pods as the operator renders them, each pod's command run under its
pod's security (read-only root, uid 10001, no capabilities; tests/helpers/pod_sandbox.py acts out
the container runtime, no cluster here). The judge pod serves the toy task's tiny reward model
from the model claim; the trainer trains on its scores alone (examples/tiny-judge.yaml's job). That
the policy learns from them is tests/judge/test_learning.py's run of the same processes under
`grpojob run` (40 steps): here a few steps show the pods' wiring, so the suite does not train the
same job twice (CI time)."""
from __future__ import annotations

import copy
import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpojob import auth, plan
from grpojob.api import parse
from grpojob.local.processes import free_port
from grpojob.local.progress import read_records
from grpojob_operator import children, judges
from grpojob_operator import names as n
from tests.helpers import pod_sandbox, statefulset
from tests.helpers.trainer_status import wait_completed

from .conftest import PER_POD, job_manifest
from .test_pod_sandbox import stop

ok, why = pod_sandbox.available()
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.skipif(not ok, reason=f"pod sandbox unavailable: {why}")]

STEPS = 5
SECRETS = {n.token_name("t"): {auth.TOKEN_KEY: auth.generate()}}
TOKEN = SECRETS[n.token_name("t")][auth.TOKEN_KEY]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_dir) -> Path:
    """The model claim: the policy and the judge's reward model, readable by the runtime user."""
    from grpojob import tiny_cache
    from grpojob.judge.tiny import build

    out = tmp_path_factory.mktemp("claims") / "models"
    shutil.copytree(tiny_dir, out / "tiny")
    tiny_cache.build(build, out / "reward-model")
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def manifest(judge_port: int, trainer_port: int, rollout_port: int) -> dict:
    """examples/tiny-judge.yaml's job, its models on the claim: the judge's score is the only reward."""
    return job_manifest(
        "t", model={"path": "/models/tiny", "volumeClaim": "models"},
        dataset={"factory": "toy", "maxPromptLength": 32},
        rewards=[{"judge": "words"}],
        judges=[{"name": "words", "model": "/models/reward-model", "volumeClaim": "models", "engine": "hf",
                 "template": "{completion}", "score": {"label": "category_words", "transform": "sigmoid"},
                 "maxBatchSize": 128, "timeoutSeconds": 30, "retries": 3, "onFailure": "skip", "port": judge_port}],
        algorithm={"name": "grpo", "groupSize": 8},
        training={"steps": STEPS, "promptsPerStep": 16, "learningRate": 0.003, "microBatchTokens": 2048},
        trainer={"replicas": 1, "processesPerReplica": 1, "port": trainer_port},
        rollout={"replicas": 1, "backend": "hf", "port": rollout_port, "sampling": {"maxTokens": 4}},
        checkpoint={**PER_POD, "everySteps": 20})


def scrape(port: int) -> dict[str, float]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=auth.Auth(TOKEN).headers())
    text = urllib.request.urlopen(req, timeout=5).read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_the_judge_pod_alone_scores_what_the_policy_trains_on(models, tmp_path):
    ports = {"judge": free_port(), "trainer": free_port(), "rollout": free_port()}
    kids = {children.key(o): o for o in children.build(parse(manifest(ports["judge"], ports["trainer"],
                                                                      ports["rollout"])), namespace="ml")}
    sts, config = kids[("StatefulSet", n.trainer_name("t"))], kids[("ConfigMap", n.config_name("t"))]["data"]
    spec = json.loads(config[plan.CONFIG_FILE])["spec"]
    assert [r.get("judge") for r in spec["rewards"]] == ["words"] and not any(r.get("name") for r in spec["rewards"])
    ckpt = tmp_path / "checkpoints"  # trainer pod 0's claim, as the kubelet hands it over (fsGroup, setgid)
    ckpt.mkdir()
    os.chown(ckpt, 0, n.RUNTIME_UID)
    ckpt.chmod(0o2775)
    (claim,) = statefulset.claims(sts, 0)
    claims = {"models": models, claim["metadata"]["name"]: ckpt}
    # The cluster network: Services' DNS names are 127.0.0.1 here, where the pods share the ports.
    network = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port()),
               plan.ENV_SYNC_ADDR: f"127.0.0.1:{free_port()}",
               plan.ENV_JUDGE_URLS: json.dumps({"words": [f"http://127.0.0.1:{ports['judge']}"]})}
    trainer_env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(trainer_env[plan.ENV_JUDGE_URLS]) == {"words": [f"http://t-judge-words.ml.svc:{ports['judge']}"]}

    pods = {"judge": (kids[("Deployment", judges.name("t", "words"))], "t-judge-words-0"),
            "rollout": (kids[("Deployment", n.rollout_name("t"))], "t-rollout-0"),
            "trainer": (sts, "t-trainer-0")}
    procs, logs = {}, {}
    try:
        for role, (owner, pod_name) in pods.items():
            pod = statefulset.pod_spec(owner, 0) if role == "trainer" else \
                copy.deepcopy(owner["spec"]["template"]["spec"])
            work = tmp_path / role
            work.mkdir()
            logs[role] = work / "log"
            procs[role] = pod_sandbox.start(pod, work, pod_name=pod_name, config=config, claims=claims,
                                            overrides=network, secrets=SECRETS, log=logs[role])
        done = wait_completed(ports["trainer"], TOKEN, list(procs.values()), list(logs.values()), timeout=900)
        assert done["step"] == STEPS
        judged = scrape(ports["judge"])
    finally:
        for proc in procs.values():
            stop(proc)
    for role, log in logs.items():
        text = log.read_text()
        assert "Read-only file system" not in text and "Permission denied" not in text, f"{role}: {text[-2000:]}"
    records = read_records(tmp_path / "trainer" / "volumes" / "grpojob-run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(set(r["rewards"]) == {"words"} for r in records)  # the judge's score, no other reward
    assert any(r["trained_tokens"] > 0 for r in records)  # the judge's scores told completions apart
    # Every completion trained on was scored by the judge pod: groups of 8, 16 a step, at least.
    assert judged["grpojob_judge_scored_total"] >= STEPS * 16 * 8
