"""Submitted groups mixed with the trainer's own workflow: commitments reserve their share of
promptsPerStep, other environments' groups go first and displace nothing for good, the prompt
stream stays exact, and checkpoints carry registrations and queued groups across a resume.
Real parts: the tiny model generates (hf_generate), the toy workflow and reward score, the
trainer trains and checkpoints through grpojob.leader.build."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch

from grpojob.data import PromptSettings, PromptStream
from grpojob.rewards import RewardScorer
from grpojob.leader import workflows
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.contracts.rollout import Group, Sample, SamplingParams
from grpojob.leader.build import build
from grpojob.leader.trajectories.api import Request
from grpojob.leader.trajectories.queue import EnvironmentQueue
from tests.rollout.harness import load_model, make_job
from tests.rollout.inprocess import ModelGenerator

GROUP = 3


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


def _job(tiny_dir, **over):
    return make_job(tiny_dir, algorithm={"groupSize": GROUP, **over.pop("algorithm", {})},
                    rollout={"sampling": {"maxTokens": 4}, **over.pop("rollout", {})},
                    dataset={"factory": "toy", "args": {"size": 40}, "maxPromptLength": 32}, **over)


def _manager(job, tokenizer, gen, commitment=None, **pipeline):
    spec = job.spec
    p = Pipeline.from_spec(spec, **pipeline)
    envs = EnvironmentQueue(p.prompts_per_step, p.queue_limit, ["arith"])
    envs.register("arith", commitment)
    return RolloutManager(gen, workflows.build(spec, tokenizer), RewardScorer(spec, tokenizer),
                          PromptStream(PromptSettings.of(spec), tokenizer), p, environments=envs)


def env_groups(model, tokenizer, n, version=0, text="what is 2 + 2 ?"):
    """Real groups: the tiny model's completions of one prompt, as an environment scores them
    (its own generator: the workflow's calls are counted apart)."""
    gen = ModelGenerator(model, tokenizer)
    ids = tokenizer.encode(text)
    out = []
    for i in range(n):
        cs = asyncio.run(gen.generate(ids, GROUP, SamplingParams(max_tokens=4, seed=i)))
        for c in cs:
            c.policy_version = version
        out.append(Group(Sample(-1, text, ids), cs, rewards=[float(i), 1.0, 0.0],
                         reward_parts={"own": [float(i), 1.0, 0.0]}))
    return out


def seqs(step):
    """Stream positions of a step's workflow groups (environments' groups have none)."""
    return [g.sample.seq for g in step.groups if g.sample.seq >= 0]


def test_commitments_reserve_their_share_and_the_stream_stays_exact(tiny_dir, tokenizer, model):
    gen = ModelGenerator(model, tokenizer)
    job = _job(tiny_dir, training={"promptsPerStep": 4, "steps": 5})
    with _manager(job, tokenizer, gen, commitment=3) as m:
        m.start()
        m.submit("arith", env_groups(model, tokenizer, 3))
        first = m.next_step()
        assert first.from_environments == 3 and len(first.sample_ids) == 1  # 3 committed + 1 of the workflow
        assert len(gen.calls) == 1, "the workflow generated only what the commitment left"
        assert [g.sample.seq for g in first.groups] == [-1, -1, -1, 0]

        gen.version = 1
        m.set_published(1)
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("step", m.next_step()))
        t.start()
        time.sleep(1.0)
        assert "step" not in got, "the step waits for the committed groups"
        assert "environment 'arith' owes 3 group(s)" in m.environment_status()["waiting_for"]
        m.submit("arith", env_groups(model, tokenizer, 3, version=1))
        t.join(30)
        assert seqs(got["step"]) == [1] and got["step"].from_environments == 3
        assert got["step"].wait_seconds >= 1.0  # the wait shows in the step's figures
        assert m.state_dict()["stream"] == {"epoch": 0, "position": 2}


def test_groups_without_a_commitment_go_first_and_displaced_workflow_groups_come_back(tiny_dir, tokenizer, model):
    gen = ModelGenerator(model, tokenizer)
    job = _job(tiny_dir, training={"promptsPerStep": 2, "steps": 5})
    with _manager(job, tokenizer, gen) as m:
        m.start()
        m.submit("arith", env_groups(model, tokenizer, 1))
        time.sleep(1.0)  # the workflow has its two groups of step 1 ready too
        first = m.next_step()
        assert first.from_environments == 1 and seqs(first) == [0]
        assert first.in_flight == 1  # the displaced group (seq 1) waits, ready
        gen.version = 1
        m.set_published(1)  # maxStaleness 0: seq 1 (version 0) is too old now: generated again
        second = m.next_step()
        assert seqs(second) == [1, 2] and second.from_environments == 0 and second.stale == 1
        assert {c.policy_version for g in second.groups for c in g.completions} == {1}


def test_the_queue_and_registrations_survive_a_checkpoint_file(tiny_dir, tokenizer, model, tmp_path):
    job = _job(tiny_dir, rollout={"workflow": "none"}, training={"promptsPerStep": 2})
    spec = job.spec
    p = Pipeline.from_spec(spec)
    with RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(2, p.queue_limit)) as m:
        m.register("arith", 2)
        m.start()
        sent = env_groups(model, tokenizer, 2)
        m.submit("arith", sent)
        torch.save(m.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # as checkpoint.load reads it
    with RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(2, p.queue_limit)) as m:
        m.load_state_dict(state)
        assert m.environment_status()["environments"]["arith"]["groups_per_step"] == 2
        m.start()
        step = m.next_step()
        assert [g.rewards for g in step.groups] == [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
        assert [[c.completion_ids for c in g.completions] for g in step.groups] == \
            [[c.completion_ids for c in g.completions] for g in sent]
        assert step.groups[1].completions[2].logprobs == sent[1].completions[2].logprobs


def _api(run, method, path, body=None):
    code, doc = run.trajectory_api().handle(Request(method, "/trajectories" + path, {},
                                                    json.dumps(body).encode() if body else b""))
    return code, doc


def _wire(groups):
    return [{"prompt_ids": g.sample.prompt_ids, "prompt": g.sample.prompt, "rewards": g.rewards,
             "reward_parts": g.reward_parts,
             "completions": [{"token_ids": c.completion_ids, "logprobs": c.logprobs, "policy_version": c.policy_version,
                              "finish_reason": c.finish_reason} for c in g.completions]} for g in groups]


def test_trainer_trains_on_submitted_groups_and_resumes_with_the_queued_ones(tiny_dir, tokenizer, model, tmp_path):
    """rollout.workflow none: the trainer's steps are the environment's groups, its rewards are
    the environment's own (metrics.jsonl), and a checkpoint taken with groups still queued
    trains them after the resume, with no new submission."""
    groups = _wire(env_groups(model, tokenizer, 4))
    over = dict(rollout={"workflow": "none"}, training={"promptsPerStep": 2, "steps": 1},
                algorithm={"maxStaleness": 1}, checkpoint={"everySteps": 1})
    run = build(_job(tiny_dir, **over), checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"))
    assert _api(run, "POST", "/register", {"name": "arith"})[0] == 200
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("phase", run.run()))
    t.start()
    while not _api(run, "GET", "/status")[1]["started"]:
        time.sleep(0.05)
    code, doc = _api(run, "POST", "/groups", {"environment": "arith", "groups": groups})
    assert code == 200 and doc["accepted"] == 4, doc
    t.join(120)
    assert done["phase"] == "completed"

    over["training"]["steps"] = 2
    resumed = build(_job(tiny_dir, **over), checkpoint_dir=str(tmp_path / "ck"), run_dir=str(tmp_path / "run"))
    assert resumed.trainer.step == 1
    assert resumed.run() == "completed"
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r, rewards in zip(records, ([0, 1, 0, 1, 1, 0], [2, 1, 0, 3, 1, 0])):
        assert r["groups_from_environments"] == 2 and r["sample_ids"] == []
        assert r["reward_mean"] == pytest.approx(sum(rewards) / 6)
        assert r["rewards"]["own"] == pytest.approx(sum(rewards) / 6)  # the environment's own part
        assert r["environments"]["arith"]["groups"] == 2
        assert r["rollout_idle_fraction"] is None
