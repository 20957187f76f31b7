"""The trajectory API over HTTP: the trainer leader's real server, a real RolloutManager behind it.
Registration, validation that names the field, the version floor and the queue limit, status
figures, and the step that takes the submitted groups."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from grpojob.auth import Auth
from grpojob.plan import TRAJECTORY_PREFIX
from grpojob.leader.rollout_client import RolloutError
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.leader.trajectories.api import TrajectoryAPI
from grpojob.leader.trajectories.queue import EnvironmentQueue
from grpojob.leader.trajectories.wire import Limits

GROUP, VOCAB, PPS = 3, 512, 2
TOKEN = "trajectory-test-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def post(url, body, headers=BEARER):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **headers},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (raw.decode() if e.code == 401 else json.loads(raw))


def get(url):
    with urllib.request.urlopen(urllib.request.Request(url, headers=BEARER), timeout=30) as r:
        return json.loads(r.read())


def group(version=0, n=GROUP, reward=(0.0, 0.5, 1.0), **completion):
    return {"prompt_ids": [5, 6, 7], "prompt": "2 + 2",
            "completions": [{"token_ids": [10, 11], "logprobs": [-0.5, -1.25], "policy_version": version,
                             **completion} for _ in range(n)],
            "rewards": list(reward)[:n], "reward_parts": {"correct": list(reward)[:n]}}


@pytest.fixture
def api():
    pipeline = Pipeline(prompts_per_step=PPS, total_steps=10, max_staleness=1, timeout=20)
    manager = RolloutManager(None, None, None, None, pipeline,
                             environments=EnvironmentQueue(PPS, pipeline.queue_limit, ["arith"]))
    server = LeaderServer(StatusBoard(10), "127.0.0.1", 0, Auth(TOKEN)).start()
    base = f"http://127.0.0.1:{server.port}{TRAJECTORY_PREFIX}"
    try:
        yield manager, server, base
    finally:
        server.stop()
        manager.close()


def mount(manager, server):
    server.mount_trajectories(TrajectoryAPI(manager, Limits(GROUP, VOCAB, 16),
                                            {"temperature": 1.0, "max_tokens": 4}, policy_version=lambda: 3))


def test_register_submit_and_the_step_takes_the_groups(api):
    manager, server, base = api
    assert post(base + "/register", {"name": "arith"}) == (503, {
        "error": "the trainer is still loading: the trajectory API opens once its rollout side is built; retry",
        "reason": "starting"})
    mount(manager, server)
    assert post(base + "/register", {"name": "arith"}, headers={}) == (401, "unauthorized")  # no token
    code, doc = post(base + "/register", {"name": "arith", "groups_per_step": 1, "replica": "arith-0"})
    assert code == 200 and doc["group_size"] == GROUP and doc["groups_per_step"] == 1
    assert doc["sampling"] == {"temperature": 1.0, "max_tokens": 4} and doc["version_floor"] == -1
    code, doc = post(base + "/groups", {"environment": "arith", "groups": [group()]})
    assert (code, doc["reason"]) == (503, "starting")  # before the loop starts taking groups

    manager.start()
    code, doc = post(base + "/groups", {"environment": "arith", "groups": [group(), group(reward=(1, 1, 0))]})
    assert code == 200 and doc["accepted"] == 2 and doc["queued"] == 2
    step = manager.next_step()
    assert step.from_environments == PPS and step.sample_ids == [] and step.idle_fraction is None
    assert [g.rewards for g in step.groups] == [[0.0, 0.5, 1.0], [1, 1, 0]]
    c = step.groups[0].completions[0]
    assert (c.prompt_ids, c.completion_ids, c.logprobs, c.policy_version) == ([5, 6, 7], [10, 11], [-0.5, -1.25], 0)
    assert step.environments["arith"]["groups"] == 2
    assert step.environments["arith"]["rewards"]["correct"] == pytest.approx(3.5 / 6)
    mean, std = step.environment_rewards["correct"]
    assert mean == pytest.approx(3.5 / 6) and std > 0

    st = get(base + "/status")
    assert st["policy_version"] == 3 and st["published_version"] == 0 and st["steps_taken"] == 1
    assert st["environments"]["arith"] | {"last_seen_seconds": 0} == {
        "groups_per_step": 1, "queued": 0, "accepted": 2, "trained": 2, "stale": 0, "refused": {},
        "last_seen_seconds": 0}


BAD = [
    ({"environment": "arith", "groups": [group(n=2)]},
     "groups[0].completions: 2 completions; a group has algorithm.groupSize = 3"),
    ({"environment": "arith", "groups": [group(token_ids=[10, 600])]},
     "groups[0].completions[0].token_ids[1]: 600 is outside the vocabulary (512 tokens)"),
    ({"environment": "arith", "groups": [{**group(), "prompt_ids": [-1]}]},
     "groups[0].prompt_ids[0]: -1 is outside the vocabulary (512 tokens)"),
    ({"environment": "arith", "groups": [group(logprobs=[-0.5])]},
     "groups[0].completions[0].logprobs: 1 entries for 2 token_ids"),
    ({"environment": "arith", "groups": [group(loss_mask=[1, 2])]},
     "groups[0].completions[0].loss_mask[1]: 2: use 1 (trained on) or 0"),
    ({"environment": "arith", "groups": [group(logprobs=[0.5, -1.0])]},
     "groups[0].completions[0].logprobs[0]: 0.5 is a log-probability above 0"),
    ({"environment": "arith", "groups": [group(versions=[0, 1], policy_version=1)]},
     "groups[0].completions[0].policy_version: 1, but the oldest of versions is 0"),
    ({"environment": "arith", "groups": [group(policy_version=None)]},
     "groups[0].completions[0].policy_version: required (or versions, one per token)"),
    ({"environment": "arith", "groups": [{**group(), "rewards": [1.0]}]},
     "groups[0].rewards: 1 values for 3 completions"),
    ({"environment": "arith", "groups": [{**group(), "reward_parts": {"x": [1, 2]}}]},
     "groups[0].reward_parts.x: 2 values for 3 completions"),
    ({"environment": "arith", "groups": [group(token_ids=list(range(14)), logprobs=[-1.0] * 14)]},
     "groups[0].completions[0]: prompt + completion = 17 tokens, more than training.microBatchTokens (16)"),
    ({"environment": "arith", "groups": [group(token_ids=["10", 11])]},
     "groups[0].completions[0].token_ids[0]: Input should be a valid integer"),
    ({"environment": "arith", "groups": [group(extra=1)]}, "groups[0].completions[0].extra: Extra inputs"),
    ({"environment": "arith", "groups": []}, "groups: List should have at least 1 item"),
    ({"groups": [group()]}, "environment: Field required"),
    (b"{not json", "body: not JSON"),
]


@pytest.mark.parametrize("body, words", BAD, ids=[w.split(":")[0] for _, w in BAD])
def test_bad_submissions_are_refused_naming_the_field(api, body, words):
    manager, server, base = api
    mount(manager, server)
    post(base + "/register", {"name": "arith"})
    manager.start()
    code, doc = post(base + "/groups", body)
    assert code == 400 and doc["reason"] == "invalid", doc
    assert words in doc["error"], doc["error"]
    st = get(base + "/status")
    groups = body.get("groups") if isinstance(body, dict) else None
    assert st["queued"] == 0 and st["refused"] == {"invalid": max(1, len(groups or []))}


def test_versions_floor_queue_limit_and_registration_rules(api):
    manager, server, base = api
    mount(manager, server)
    assert post(base + "/register", {"name": "Arith"})[1]["error"].startswith("name: String should match")
    assert post(base + "/register", {"name": "arith", "groups_per_step": 2})[0] == 200
    code, doc = post(base + "/register", {"name": "other", "groups_per_step": 1})
    assert code == 409 and "promptsPerStep is 2 and other environments commit to 2 (arith: 2)" in doc["error"]
    assert post(base + "/register", {"name": "other"})[0] == 200  # without a commitment: fine
    manager.start()
    assert post(base + "/groups", {"environment": "nobody", "groups": [group()]})[0] == 404

    manager.set_published(3)  # floor 2; the next version the trainer can publish is 4
    code, doc = post(base + "/groups", {"environment": "arith", "groups": [group(2), group(1)]})
    assert code == 409 and doc["reason"] == "stale" and "groups [1] are of policy version 1, below the floor 2" \
        in doc["error"]
    code, doc = post(base + "/groups", {"environment": "arith", "groups": [group(5)]})
    assert code == 400 and doc["reason"] == "future" and "the newest the rollout servers can hold is 4" in doc["error"]
    code, doc = post(base + "/groups", {"environment": "arith", "groups": [group(2, versions=[2, 3])] * 3})
    assert code == 200 and doc["accepted"] == 3
    code, doc = post(base + "/groups", {"environment": "other", "groups": [group(3)] * 2})
    assert code == 429 and "limit is 4" in doc["error"]  # (maxStaleness 1 + 1) x everySteps 1 x promptsPerStep 2

    manager.set_published(4)  # floor 3: the three version-2 groups are dropped, and counted
    time.sleep(0.1)
    st = get(base + "/status")
    assert st["version_floor"] == 3 and st["queued"] == 0
    assert st["environments"]["arith"]["stale"] == 3 and st["environments"]["arith"]["refused"] == {
        "stale": 2, "future": 1}
    assert st["environments"]["other"]["refused"] == {"full": 2}
    assert st["refused"] == {"unregistered": 1, "stale": 2, "future": 1, "full": 2}
    assert st["reserved_per_step"] == 2


def test_a_step_waits_for_commitments_and_names_what_it_waits_for(api):
    """With rollout.workflow none and nothing submitted the step never hangs silently: its
    timeout names the environments it waits for (and spec.environments that never registered)."""
    manager, server, base = api
    mount(manager, server)
    manager.start()
    with pytest.raises(RolloutError, match=r"waiting for .*2 group\(s\) from any environment \(registered: none\); "
                                           r"spec.environments never registered: arith"):
        manager.run(manager._take(), timeout=0.5)
    post(base + "/register", {"name": "arith", "groups_per_step": 2})
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("step", manager.next_step()))
    t.start()
    time.sleep(0.3)
    assert "step" not in got and "environment 'arith' owes 2 group(s)" in get(base + "/status")["waiting_for"]
    assert post(base + "/groups", {"environment": "arith", "groups": [group()]})[0] == 200
    time.sleep(0.2)
    assert "step" not in got and "owes 1 group(s)" in get(base + "/status")["waiting_for"]
    assert post(base + "/groups", {"environment": "arith", "groups": [group()]})[0] == 200
    t.join(10)
    assert got["step"].from_environments == 2 and got["step"].wait_seconds >= 0.5
