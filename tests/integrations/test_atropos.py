"""An unchanged atroposlib BaseEnv (examples/environments/atropos/words_env.py) through its own
`serve` CLI, against a real rollout server process (vLLM's /generate under /vllm) and the trainer
leader's run-api routes: the groups handed to training hold exactly the tokens the rollout server
generated, with its log-probs (recomputed here with the model) and the versions it recorded."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

from grpojob.auth import Auth
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.leader.trajectories.api import TrajectoryAPI
from grpojob.leader.trajectories.atropos import AtroposAPI, http_lookup
from grpojob.leader.trajectories.queue import EnvironmentQueue
from grpojob.leader.trajectories.wire import Limits
from grpojob.local.processes import free_port
from tests.rollout.harness import TOKEN, RolloutProcess, load_model, make_job, wait_for, write_config

pytest.importorskip("atroposlib", reason="atroposlib (the environments set)")
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ENV = ROOT / "examples" / "environments" / "atropos" / "words_env.py"
GROUP = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("atropos")
    job = make_job(tiny_dir, algorithm={"groupSize": GROUP})
    p = Pipeline(prompts_per_step=1, total_steps=10, max_staleness=1)
    manager = RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(1, p.queue_limit))
    manager.start()
    leader = LeaderServer(StatusBoard(10), "127.0.0.1", free_port(), Auth(TOKEN)).start()
    srv = RolloutProcess(write_config(job, tmp / "job.json"), tmp, replica="atropos").start()
    api = TrajectoryAPI(manager, Limits(group_size=GROUP, vocab_size=512, max_sequence_tokens=256), {})
    api.atropos = AtroposAPI(api, http_lookup(lambda: [srv.url], TOKEN), batch_size=GROUP * 2, total_steps=10)
    leader.mount_trajectories(api)
    try:
        srv.wait_ready()
        yield {"srv": srv, "manager": manager, "url": f"http://127.0.0.1:{leader.port}/trajectories/atropos",
               "tmp": tmp}
    finally:
        srv.stop()
        leader.stop()
        manager.close()


def _post(url: str, doc, gz: bool = False) -> tuple[int, dict]:
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json", **({"Content-Encoding": "gzip"} if gz else {})}
    req = urllib.request.Request(url, data=gzip.compress(body) if gz else body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw.startswith(b"{") else {"text": raw.decode()}


def test_an_atropos_env_through_its_serve_cli_delivers_exact_groups(stack, tiny_dir):
    srv, manager = stack["srv"], stack["manager"]
    log = open(stack["tmp"] / "env.log", "w")
    env = subprocess.Popen(
        [sys.executable, str(ENV), "serve", "--env.rollout_server_url", f"{stack['url']}/{TOKEN}",
         "--env.tokenizer_name", str(tiny_dir), "--env.group_size", str(GROUP), "--env.use_wandb", "false",
         "--openai.server_type", "vllm", "--openai.base_url", f"{srv.url}/vllm/v1", "--openai.api_key", TOKEN,
         "--openai.model_name", "tiny", "--openai.tokenizer_name", str(tiny_dir)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    try:
        wait_for(lambda: manager.environment_status()["queued"] >= 1, 120, "a group from the Atropos env",
                 interval=0.5)
        print(f"first group after {time.monotonic() - start:.1f} s")
    except AssertionError:
        raise AssertionError((stack["tmp"] / "env.log").read_text()[-3000:]) from None
    finally:
        env.kill()
        env.wait(10)
        log.close()
    (group,) = manager.next_step().groups
    assert len(group.completions) == GROUP and group.sample.row["environment"].startswith("atropos-")
    model = load_model(tiny_dir)
    for c in group.completions:
        ids = torch.tensor([c.prompt_ids + c.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(c.prompt_ids) - 1:-1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.completion_ids)[:, None]).squeeze(-1)
        assert c.logprobs == pytest.approx(ref.tolist(), abs=1e-3)  # the rollout server's own, at temperature 1
        assert c.policy_version == 0 and all(c.loss_mask or [1])  # the versions it recorded; every token trained


def test_bad_scored_data_names_the_fix_and_the_token_is_the_paths(stack):
    url = stack["url"]
    assert _post(f"{url}/wrong-token/register-env", {"desired_name": "x"})[0] == 401
    status, reg = _post(f"{url}/{TOKEN}/register-env", {"desired_name": "probe", "group_size": GROUP,
                                                        "max_token_length": 64, "weight": 1.0})
    assert status == 200 and reg["status"] == "success", reg
    data = {"env_id": reg["env_id"], "tokens": [[5, 6, 7, 8]] * GROUP, "masks": [[-100, -100, 7, 8]] * GROUP,
            "scores": [0.0] * GROUP}
    status, out = _post(f"{url}/{TOKEN}/scored_data", data, gz=True)
    assert status == 400 and "--openai.server_type vllm" in out["error"]
    data["inference_logprobs"] = [[1.0, 1.0, -0.5, -0.5]] * GROUP
    status, out = _post(f"{url}/{TOKEN}/scored_data", data, gz=True)
    assert status == 400 and "were not generated by this job's rollout servers" in out["error"]
    status, out = _post(f"{url}/{TOKEN}/register-env", {"desired_name": "probe", "group_size": GROUP + 1})
    assert status == 400 and f"--env.group_size {GROUP}" in out["error"]


def test_the_example_learns_through_grpojob_run(tmp_path):
    """examples/environments/atropos/words.yaml end to end: measured 0.03 -> 0.69 in 40 steps (129 s)."""
    from grpojob.local.progress import read_records

    doc = yaml.safe_load((ROOT / "examples/environments/atropos/words.yaml").read_text())
    doc["spec"]["environments"][0]["command"] = [sys.executable, "-m", "grpojob.integrations.atropos", str(ENV),
                                                 "serve"]
    doc["spec"]["model"]["path"] = str(tmp_path / "tiny-model")
    (tmp_path / "words.yaml").write_text(yaml.safe_dump(doc))
    steps, pps = 40, doc["spec"]["training"]["promptsPerStep"]  # 30 steps: 0.03 -> 0.26 (it takes off late)
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(tmp_path / "words.yaml"), "--run-dir",
                           str(tmp_path / "run"), "--no-progress", "--set", f"training.steps={steps}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert all(r["groups_from_environments"] == pps and r["environments"]["atropos-words"]["groups"] == pps
               for r in records)
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    assert last >= first + 0.2, f"reward {first:.3f} -> {last:.3f}"
