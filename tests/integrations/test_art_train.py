"""An ART training script (examples/frameworks/art/words.py: openpipe-art 0.5's own Model,
Trajectory, TrajectoryGroup, gather_trajectory_groups, backend.train and model.log, sampling with
the model's OpenAI client) trains a GRPOJob through `grpojob run` with one line changed, the
backend's; and ART's per-call settings are refused by name before anything is posted. Needs
openpipe-art (the art set, .ci/sets/art.sh): skipped elsewhere."""
from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # ART imports litellm: no fetch of its price list
art = pytest.importorskip("art", reason="openpipe-art (the art set, .ci/sets/art.sh)")

from grpojob.integrations.art import GRPOJobBackend  # noqa: E402
from grpojob.integrations.art_settings import SettingRefused  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "frameworks" / "art"


def test_the_example_differs_from_an_art_script_by_its_backend_line_only():
    source = (EXAMPLE / "words.py").read_text()
    tree = ast.parse(source)
    ours = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("grpojob")]
    assert [(n.module, [(a.name, a.asname) for a in n.names]) for n in ours] == \
        [("grpojob.integrations.art", [("GRPOJobBackend", "LocalBackend")])]
    # that line back as ART writes it: the script is ART's (nothing else of grpojob in its code)
    line = source.splitlines()[ours[0].lineno - 1]
    art_script = source.replace(line, "from art.local import LocalBackend")
    names = {n.id for n in ast.walk(ast.parse(art_script)) if isinstance(n, ast.Name)}
    assert "LocalBackend" in names and not any("grpojob" in n.lower() for n in names)
    assert "backend = LocalBackend()" in source


def test_settings_the_job_does_not_have_are_refused_by_name_before_anything_is_posted(tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"spec": {"training": {"learningRate": 0.003}}}))
    backend = GRPOJobBackend(trajectory_url="http://127.0.0.1:9/trajectories", token="t",
                             openai_base_urls=["http://127.0.0.1:9/v1"], config_path=str(config))
    model = art.TrainableModel(name="m", project="p", base_model="tiny")

    async def train(**settings):
        return await backend.train(model, [], **settings)

    with pytest.raises(SettingRefused, match=r"learning_rate=1e-05.*spec\.training\.learningRate = 0\.003"):
        asyncio.run(train(learning_rate=1e-5))
    with pytest.raises(SettingRefused, match="loss_fn='cispo'"):
        asyncio.run(train(learning_rate=0.003, loss_fn="cispo"))
    with pytest.raises(TypeError, match="lerning_rate"):
        asyncio.run(train(lerning_rate=0.003))


@pytest.mark.slow
def test_an_art_script_with_its_backend_line_changed_trains_a_grpojob(tmp_path):
    from grpojob.local.progress import read_records

    steps = 30
    doc = yaml.safe_load((EXAMPLE / "words.yaml").read_text())
    env = doc["spec"]["environments"][0]
    env["command"] = [sys.executable, str(EXAMPLE / "words.py")]
    env["env"] = [e if e["name"] != "ART_STEPS" else {"name": "ART_STEPS", "value": str(steps)} for e in env["env"]]
    doc["spec"]["model"]["path"] = str(tmp_path / "tiny-model")
    (tmp_path / "words.yaml").write_text(yaml.safe_dump(doc))
    pps = doc["spec"]["training"]["promptsPerStep"]
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(tmp_path / "words.yaml"), "--run-dir",
                           str(tmp_path / "run"), "--no-progress", "--max-restarts", "0",
                           "--set", f"training.steps={steps}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    log = tmp_path / "run" / "logs" / "env-art-0.log"
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:  # every group is the ART script's, with its trajectories' metrics as reward parts
        assert r["groups_from_environments"] == pps and r["environments"]["art"]["groups"] == pps
        assert set(r["rewards"]) == {"has_word"}  # ART's automatic completion_tokens is no reward part
    # ART's side: each train() returned the trainer's policy version as its step, and model.log wrote
    # ART's own history of the same steps
    printed = re.findall(r"^step (\d+): reward", log.read_text(), flags=re.M)  # the script's own print
    assert [int(x) for x in printed] == list(range(1, steps + 1))
    history = [json.loads(x) for x in (tmp_path / ".art" / "grpojob-art" / "models" / "words-001" /
                                        "history.jsonl").read_text().splitlines()]
    assert sorted({h["step"] for h in history if "train/reward" in h}) == list(range(1, steps + 1))
    first = sum(r["reward_mean"] for r in records[:3]) / 3
    last = sum(r["reward_mean"] for r in records[-3:]) / 3
    assert last >= first + 0.15, f"reward {first:.3f} -> {last:.3f}"  # measured 0.02 -> 0.29 (175 s)


@pytest.mark.slow
def test_train_hands_the_trainer_exactly_the_tokens_the_rollout_server_sampled(tmp_path, tiny_dir):
    """ART's real objects through the backend against a rollout server process and the leader's
    trajectory API; the test plays the trainer's part (it takes the step's groups, then reports the
    new policy version and its publication), so train() returns. The groups the trainer gets hold the
    rollout server's tokens, its log-probs (recomputed here with the model) and its versions."""
    import threading

    from grpojob.auth import Auth
    from grpojob.leader.manager import Pipeline, RolloutManager
    from grpojob.leader.server import LeaderServer, StatusBoard
    from grpojob.leader.trajectories.api import TrajectoryAPI
    from grpojob.leader.trajectories.queue import EnvironmentQueue
    from grpojob.leader.trajectories.wire import Limits
    from grpojob.local.processes import free_port
    from tests.rollout.harness import TOKEN, RolloutProcess, make_job, write_config

    group, per_step = 4, 2
    job = make_job(tiny_dir, algorithm={"groupSize": group}, training={"promptsPerStep": per_step,
                                                                       "learningRate": 0.003})
    config = write_config(job, tmp_path / "job.json")
    p = Pipeline(prompts_per_step=per_step, total_steps=10)
    manager = RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(per_step, p.queue_limit))
    manager.start()
    version = {"v": 0}
    leader = LeaderServer(StatusBoard(10), "127.0.0.1", free_port(), Auth(TOKEN)).start()
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4}
    leader.mount_trajectories(TrajectoryAPI(manager, Limits(group_size=group, vocab_size=512, max_sequence_tokens=256),
                                            sampling, policy_version=lambda: version["v"]))
    srv = RolloutProcess(config, tmp_path, replica="art").start()
    taken = []

    def trainer():  # the trainer's part: take the step, train (instantly), publish
        taken.append(manager.next_step())
        version["v"] = 1
        manager.set_published(1)

    async def script():
        backend = GRPOJobBackend(trajectory_url=f"http://127.0.0.1:{leader.port}/trajectories", token=TOKEN,
                                 openai_base_urls=[srv.url + "/v1"], config_path=str(config), environment="art")
        model = art.TrainableModel(name="exact", project="grpojob-art", base_model="tiny")
        await model.register(backend)
        client = model.openai_client()

        async def rollout(category: str) -> art.Trajectory:
            messages = [{"role": "user", "content": f"list {category} :"}]
            out = await client.chat.completions.create(model=model.get_inference_name(), messages=messages,
                                                       max_completion_tokens=4, temperature=0.3)
            return art.Trajectory(messages_and_choices=[*messages, out.choices[0]], reward=float(len(out.choices)),
                                  metrics={"seen": 1.0})

        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(c) for _ in range(group)) for c in ("animals", "colors")])
        thread = threading.Thread(target=trainer)
        thread.start()
        result = await backend.train(model, groups, learning_rate=0.003)
        thread.join(30)
        step = await model.get_step()
        await backend.close()
        return groups, result, step

    try:
        srv.wait_ready()
        groups, result, step = asyncio.run(script())
    finally:
        srv.stop()
        leader.stop()
        manager.close()
    assert result.step == 1 and step == 1 and result.metrics["job_steps"] == 1.0
    (got,) = taken
    assert got.from_environments == per_step and len(got.groups) == per_step
    seqs = []
    for art_group, ours in zip(groups, got.groups):
        assert ours.sample.row["environment"] == "art" and ours.reward_parts == {"seen": [1.0] * group}
        for traj, c in zip(art_group.trajectories, ours.completions):
            choice = traj.messages_and_choices[-1]
            assert c.completion_ids == [int(e.token.split(":")[1]) for e in choice.logprobs.content]
            assert c.prompt_ids + c.completion_ids == choice.model_extra["prompt_token_ids"] + choice.model_extra["token_ids"]
            assert c.policy_version == 0 and c.reward == 1.0 and c.loss_mask is None
            seqs.append(c)
    # at the job's temperature 1.0, not the request's 0.3: the backend's endpoint sets the job's sampling
    ref = _logprobs(tiny_dir, [(c.prompt_ids, c.completion_ids) for c in seqs])
    for c, lps in zip(seqs, ref):
        assert c.logprobs == pytest.approx(lps, abs=1e-3)


REFERENCE = """
import json, sys, torch
from tests.rollout.harness import load_model
model, out = load_model(sys.argv[1]), []
for prompt, completion in json.load(sys.stdin):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist())
print(json.dumps(out))
"""


def _logprobs(model_dir, seqs) -> list[list[float]]:
    """Each completion's log-probs under the model, in a process of its own: `import art` replaces
    transformers' masking_utils._preprocess_mask_arguments with a wrapper written for transformers
    5.2, which breaks a model's forward under 5.24 in any process that imported art."""
    proc = subprocess.run([sys.executable, "-c", REFERENCE, str(model_dir)], input=json.dumps(seqs), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
