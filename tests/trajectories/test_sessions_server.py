"""Agent sessions end to end, with the real parts: a rollout server process (hf engine, the tiny
model with tool-call tokens), the trainer leader's HTTP server with the trajectory API over a
RolloutManager, and the real `openai` client (tools, streaming, a session id header). The client
never sees a token; the group the manager hands to training holds exactly the tokens the model
was given and produced, turn by turn."""
from __future__ import annotations

import json

import openai
import pytest

from grpojob.auth import Auth
from grpojob.local.processes import free_port
from grpojob.plan import ENV_TRAJECTORY_URL
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.tiny import build
from grpojob.leader.server import LeaderServer, StatusBoard
from grpojob.leader.trajectories.api import TrajectoryAPI
from grpojob.leader.trajectories.queue import EnvironmentQueue
from grpojob.leader.trajectories.sessions import Sessions
from grpojob.leader.trajectories.wire import Limits
from tests.rollout.harness import TOKEN, RolloutProcess, http, make_job, write_config

pytestmark = pytest.mark.slow
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate arithmetic",
                                           "parameters": {"type": "object",
                                                          "properties": {"expression": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sessions")
    model = build(tmp / "tiny-tools", tools=True)
    job = make_job(model, algorithm={"groupSize": 2, "maxStaleness": 1}, training={"microBatchTokens": 512},
                   rollout={"backend": "hf", "sampling": {"maxTokens": 6}, "maxModelLen": 400})
    p = Pipeline(prompts_per_step=1, total_steps=10, max_staleness=1)
    manager = RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(1, p.queue_limit))
    manager.start()
    leader = LeaderServer(StatusBoard(10), "127.0.0.1", free_port(), Auth(TOKEN)).start()
    limits = Limits(group_size=2, vocab_size=514, max_sequence_tokens=512)
    leader.mount_trajectories(TrajectoryAPI(manager, limits, {}, sessions=Sessions(manager, limits)))
    api = f"http://127.0.0.1:{leader.port}/trajectories"
    srv = RolloutProcess(write_config(job, tmp / "job.json"), tmp, replica="sessions",
                         env={ENV_TRAJECTORY_URL: api}).start()
    try:
        srv.wait_ready()
        yield {"srv": srv, "manager": manager, "api": api, "model": model}
    finally:
        srv.stop()
        leader.stop()
        manager.close()


def chat(client, messages, **kw):
    """One streamed turn, read with the openai client: (content, the chunks' extension fields)."""
    content, extra = "", {}
    for chunk in client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True,
                                                max_tokens=6, extra_body={"return_token_ids": True}, **kw):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            extra.update(ch.model_extra or {})
    return content, extra


def test_a_multi_turn_tool_session_becomes_a_training_group(stack):
    srv, manager = stack["srv"], stack["manager"]
    turns = {}
    for sid in ("s1", "s2"):
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0,
                               default_headers={"X-Session-Id": sid, "X-Session-Group": "task-7",
                                                "X-Session-Environment": "calc"})
        messages = [{"role": "user", "content": "what is 3 + 4 ?"}]
        seen = []
        for follow in ({"role": "tool", "tool_call_id": "call_1", "content": "7"},
                       {"role": "user", "content": "so ?"}, None):
            content, extra = chat(client, messages, seed=len(seen) + (sid == "s2") * 10)
            seen.append((extra["prompt_token_ids"], extra["token_ids"]))
            if follow is not None:
                messages += [{"role": "assistant", "content": content}, follow]
        # every turn's prompt is the previous prompt + what the model produced + the new context
        for (p0, c0), (p1, _) in zip(seen, seen[1:]):
            assert p1[:len(p0) + len(c0)] == p0 + c0
        turns[sid] = seen
        status, out = http(f"{srv.url}/v1/sessions/{sid}/reward", {"reward": 1.0 if sid == "s1" else 0.0})
        assert status == 200, out
    assert out["submitted"] == 1 and out["group"] == "calc/task-7"

    step = manager.next_step()
    (group,) = step.groups
    for sid, c in zip(("s1", "s2"), group.completions):
        seen = turns[sid]
        (first_prompt, _), (last_prompt, last_ids) = seen[0], seen[-1]
        assert c.prompt_ids == first_prompt
        assert first_prompt + c.completion_ids == last_prompt + last_ids  # the exact tokens, in order
        trained = [t for t, m in zip(c.completion_ids, c.loss_mask) if m]
        assert trained == [t for _, ids in seen for t in ids]  # exactly what the model generated
        assert sum(c.loss_mask) < len(c.loss_mask)  # the tool result and user turn are masked out
    assert group.rewards == [1.0, 0.0] and step.environments["calc"]["groups"] == 1


def test_session_requests_need_the_token_and_one_completion(stack):
    srv = stack["srv"]
    # the other tests share this stack (and may run before, after or on another worker): compare with now
    before = http(f"{stack['api']}/status")[1]["sessions"]["counts"].get("ended", 0)
    status, _ = http(f"{srv.url}/v1/sessions/s9/reward", {"reward": 1.0}, token=None)
    assert status == 401
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0,
                           default_headers={"X-Session-Id": "s9"})
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2, max_tokens=2)
    status, out = http(f"{srv.url}/v1/sessions/never/reward", {"reward": 1.0})
    assert status == 404 and out["reason"] == "unknown"
    status, out = http(f"{stack['api']}/status")
    # none of the refused requests ended a session (or opened one that a reward could end)
    assert status == 200 and out["sessions"]["counts"].get("ended", 0) == before
    assert http(f"{srv.url}/v1/sessions/s9/reward", {"reward": 1.0})[0] == 404


def test_plain_requests_stream_too(stack):
    srv = stack["srv"]
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=TOKEN, max_retries=0)
    whole = client.completions.create(model="tiny", prompt="what is", max_tokens=5, temperature=0)
    parts = list(client.completions.create(model="tiny", prompt="what is", max_tokens=5, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == whole.choices[0].text
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens
    # the raw events: OpenAI's server-sent event lines, ending with [DONE]
    import urllib.request
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [x for x in r.read().decode().split("\n\n") if x]
    assert all(x.startswith("data: ") for x in lines) and lines[-1] == "data: [DONE]"
