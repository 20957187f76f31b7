"""Atropos's ScoredData `overrides` and `group_overrides` on the trainer leader's run-api routes (a
real LeaderServer, RolloutManager and the rollout servers' own record of what they generated as
the version lookup), as atroposlib 0.4's own trainer reads them: `set_advantage_to_zero` leaves a
sequence untrained while its score still counts in the group's advantages; a temperature or a group
size the job cannot train at is refused naming the field and the fix. No atroposlib needed: these
are the JSON bodies its BaseEnv posts."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from grpojob import algorithms
from grpojob.api.spec import AlgorithmSpec, OverlongSpec
from grpojob.auth import Auth
from grpojob.contracts.rollout import Completion
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.leader.trajectories.api import TrajectoryAPI
from grpojob.leader.trajectories.atropos import AtroposAPI
from grpojob.leader.trajectories.queue import EnvironmentQueue
from grpojob.leader.trajectories.wire import Limits
from grpojob.learner.batch import prepare
from grpojob.learner.dist import DistEnv
from grpojob.rollout.token_api import Generated

GROUP, TOKEN, TEMPERATURE = 4, "atropos-overrides-token", 0.7
PROMPT = [5, 6, 7]
COMPLETIONS = [[10, 11], [12, 13], [14, 15], [16, 17]]
LOGPROBS = [-0.5, -1.25]


@pytest.fixture
def leader():
    generated = Generated()  # the rollout server's record (rollout/token_api.py), what /vllm/versions answers
    for ids in COMPLETIONS:
        generated.add(PROMPT, Completion(prompt_ids=PROMPT, completion_ids=ids, logprobs=LOGPROBS, policy_version=0))
    pipeline = Pipeline(prompts_per_step=1, total_steps=10, max_staleness=1, timeout=20)
    manager = RolloutManager(None, None, None, None, pipeline, environments=EnvironmentQueue(1, pipeline.queue_limit))
    manager.start()
    server = LeaderServer(StatusBoard(10), "127.0.0.1", 0, Auth(TOKEN)).start()
    api = TrajectoryAPI(manager, Limits(group_size=GROUP, vocab_size=512, max_sequence_tokens=256),
                        {"temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1, "max_tokens": 2})
    api.atropos = AtroposAPI(api, lambda seqs: [generated.versions(s) for s in seqs], batch_size=GROUP,
                             total_steps=10)
    server.mount_trajectories(api)
    try:
        url = f"http://127.0.0.1:{server.port}/trajectories/atropos/{TOKEN}"
        status, reg = post(f"{url}/register-env", {"desired_name": "o", "group_size": GROUP, "weight": 1.0})
        assert status == 200 and reg["status"] == "success", reg
        yield manager, url, reg["env_id"]
    finally:
        server.stop()
        manager.close()


def post(url, doc):
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scored(env_id, **extra):
    return {"env_id": env_id, "tokens": [PROMPT + c for c in COMPLETIONS], "masks": [[-100] * 3 + c for c in COMPLETIONS],
            "scores": [1.0, 0.0, 1.0, 0.0], "inference_logprobs": [[1.0] * 3 + LOGPROBS] * GROUP, **extra}


def test_set_advantage_to_zero_leaves_the_sequence_untrained_and_its_score_counted(leader):
    manager, url, env_id = leader
    status, out = post(f"{url}/scored_data", scored(env_id, overrides=[{}, {"set_advantage_to_zero": True}],
                                                    group_overrides={"sft": True}))  # a key no trainer reads
    assert status == 200, out
    (group,) = manager.next_step().groups
    assert [c.loss_mask for c in group.completions] == [[1, 1], [0, 0], [1, 1], [1, 1]]
    assert group.rewards == [1.0, 0.0, 1.0, 0.0]
    algorithm = algorithms.build(AlgorithmSpec(name="grpo"), max_tokens=2)
    prep = prepare([group], algorithm, OverlongSpec(), 2, 0, DistEnv())
    trained = {tuple(s.completion_ids): s.advantage for s in prep.seqs}
    assert set(trained) == {(10, 11), (14, 15), (16, 17)}  # the zeroed one is not trained on
    # ... but its score is in the group's statistics: the last one's advantage is the same negative
    # as if all four were trained (mean 0.5), not the one of three with mean 2/3.
    assert trained[(16, 17)] == pytest.approx(-trained[(10, 11)]) and trained[(16, 17)] < 0


@pytest.mark.parametrize("where, doc", [
    ("overrides[2].temperature", {"overrides": [{}, {}, {"temperature": 1.0}]}),
    ("generation_params.temperature", {"generation_params": {"temperature": 1.0}}),
    ("group_overrides.temperature", {"group_overrides": {"temperature": 1.0}}),
])
def test_a_temperature_the_trainer_does_not_compute_at_is_refused_naming_the_fix(leader, where, doc):
    manager, url, env_id = leader
    status, out = post(f"{url}/scored_data", scored(env_id, **doc))
    assert status == 400, out
    assert out["error"] == (f"{where} = 1.0: the trainer computes log-probs at rollout.sampling.temperature = "
                            f"{TEMPERATURE}; sample at that temperature, or set rollout.sampling.temperature: 1.0")
    # the job's own temperature, wherever it is given, is taken; a per-sequence one wins over the group's
    status, out = post(f"{url}/scored_data", scored(env_id, overrides=[{"temperature": TEMPERATURE}] * GROUP,
                                                    group_overrides={"temperature": 1.0}))
    assert status == 200, out
    assert manager.environment_status()["queued"] == 1


def test_another_group_size_is_refused_naming_it(leader):
    manager, url, env_id = leader
    status, out = post(f"{url}/scored_data", scored(env_id, group_overrides={"group_size": 8}))
    assert status == 400 and "a group of 8 sequences (group_overrides.group_size)" in out["error"]
    assert "algorithm.groupSize = 4" in out["error"] and "--env.group_size 4" in out["error"]
    doc = scored(env_id)
    doc = {k: (v[:3] if isinstance(v, list) else v) for k, v in doc.items()}
    status, out = post(f"{url}/scored_data", doc)
    assert status == 400 and out["error"].startswith("a group of 3 sequences: the job trains groups of")
    status, out = post(f"{url}/scored_data", scored(env_id, overrides=[{}] * (GROUP + 1)))
    assert status == 400 and "overrides: a list of at most 4 objects" in out["error"]
    assert manager.environment_status()["queued"] == 0
