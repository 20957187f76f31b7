"""Agent sessions, the pure parts: the prompt of each turn built on the tokens the model really
saw (rollout side), and the record that turns ended sessions into training groups (trainer side,
over a real RolloutManager taking environments' groups)."""
from __future__ import annotations

import pytest

from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.rollout.openai_api import ChatRequest
from grpojob.rollout.sessions import chat_prompt, text_prompt
from grpojob.tiny import build_tokenizer
from grpojob.leader.trajectories import wire
from grpojob.leader.trajectories.queue import EnvironmentQueue, Refused
from grpojob.leader.trajectories.sessions import ENVIRONMENT, Sessions

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3 + 4"}'}}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(512, tools=True)


def first_turn(tok, completion_text: str, end: str = "<|im_end|>"):
    """Turn 1 served: (request, the session's record after it, the completion's ids)."""
    req = ChatRequest(messages=[{"role": "user", "content": "what is 3 + 4 ?"}], tools=TOOLS)
    p = chat_prompt(None, req, tok)
    assert not p.continued and p.ids == tok(req.render(tok), add_special_tokens=False)["input_ids"]
    comp = tok.encode(completion_text) + ([tok.convert_tokens_to_ids(end)] if end else [])
    state = {"tokens": p.ids + comp, "prompt_length": len(p.ids), "mode": "chat", "rendered": p.rendered,
             "messages": 1, "returned": ""}
    return req, state, comp


def second(req, reply: dict, result: str = "7"):
    msgs = req.messages + [reply, {"role": "tool", "tool_call_id": "call_1", "content": result}]
    return ChatRequest(messages=msgs, tools=TOOLS)


def test_a_tool_turn_continues_the_tokens_the_model_produced(tok):
    # the model's call, written its own way (no space after the colon): a template re-rendering
    # it would give other tokens; the session keeps the model's
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"3 + 4"}}</tool_call>'
    req, state, comp = first_turn(tok, call)
    req2 = second(req, {"role": "assistant", "content": None, "tool_calls": [CALL]})
    p = chat_prompt(state, req2, tok)
    assert p.continued and p.ids[:len(state["tokens"])] == state["tokens"]
    # the model ended its turn with <|im_end|> itself: only the newline of the turn's end is added
    new = tok.decode(p.ids[len(state["tokens"]):], skip_special_tokens=False)
    assert new == "\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
    assert p.rendered == req2.render(tok)


def test_a_turn_that_ended_on_another_token_gets_the_templates_end(tok):
    req, state, comp = first_turn(tok, " seven", end="<|endoftext|>")  # EOS, not the template's <|im_end|>
    req2 = ChatRequest(messages=req.messages + [{"role": "assistant", "content": " seven"},
                                                {"role": "user", "content": "sure ?"}], tools=TOOLS)
    p = chat_prompt(state, req2, tok)
    assert p.continued and p.ids[:len(state["tokens"])] == state["tokens"]
    assert tok.decode(p.ids[len(state["tokens"]):], skip_special_tokens=False) == \
        "<|im_end|>\n<|im_start|>user\nsure ?<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("change", ["history", "tools", "no reply", "no new message"])
def test_a_changed_history_starts_the_session_over(tok, change):
    req, state, _ = first_turn(tok, " seven")
    reply = {"role": "assistant", "content": " seven"}
    msgs = {"history": [{"role": "user", "content": "what is 3 + 5 ?"}, reply, {"role": "user", "content": "ok"}],
            "tools": req.messages + [reply, {"role": "user", "content": "ok"}],
            "no reply": req.messages + [{"role": "user", "content": "ok"}],
            "no new message": req.messages + [reply]}[change]
    req2 = ChatRequest(messages=msgs, tools=None if change == "tools" else TOOLS)
    p = chat_prompt(state, req2, tok)
    assert not p.continued and p.ids == tok(req2.render(tok), add_special_tokens=False)["input_ids"]


def test_text_sessions_continue_after_the_returned_text(tok):
    prompt = "question : what is 3 + 4 ? answer :"
    first = text_prompt(None, prompt, tok)
    comp = tok.encode(" 7 . #")  # served; the client got " 7 ." (a stop string cut it)
    state = {"tokens": first.ids + comp, "prompt_length": len(first.ids), "mode": "text", "rendered": prompt,
             "returned": " 7 ."}
    p = text_prompt(state, prompt + " 7 . question : what is 1 + 1 ? answer :", tok)
    assert p.continued and p.ids == state["tokens"] + tok.encode(" question : what is 1 + 1 ? answer :")
    assert not text_prompt(state, "question : other", tok).continued


# ---- the trainer's record -------------------------------------------------------------------------

LIMITS = wire.Limits(group_size=2, vocab_size=514, max_sequence_tokens=64)


@pytest.fixture
def manager():
    p = Pipeline(prompts_per_step=1, total_steps=10, max_staleness=1)
    m = RolloutManager(None, None, None, None, p, environments=EnvironmentQueue(1, p.queue_limit))
    m.start()
    yield m
    m.close()


def turn(prompt, ids, version, continued=False, lps=None):
    return wire.SessionTurnIn.model_validate(
        {"mode": "chat", "group": None, "prompt_ids": prompt, "continued": continued, "rendered": "r",
         "returned": "t", "messages": 1, "completion": {"token_ids": ids, "logprobs": lps or [-0.5] * len(ids),
                                                        "policy_version": version, "text": f"turn {len(prompt)}"}},
        context=LIMITS)


def test_ended_sessions_become_a_group_with_masks_logprobs_and_versions(manager):
    s = Sessions(manager, LIMITS)
    prompt = [1, 2, 3]
    s.add_turn("a", turn(prompt, [10, 11], 0, lps=[-0.1, -0.2]))
    # turn 2 of a: its prompt is a's tokens + a tool result (20, 21)
    s.add_turn("a", turn(prompt + [10, 11, 20, 21], [12], 1, continued=True, lps=[-0.3]))
    assert s.state("a")["tokens"] == [1, 2, 3, 10, 11, 20, 21, 12] and s.state("a")["prompt_length"] == 7
    s.add_turn("b", turn(prompt, [13, 14, 15], 1))
    out = s.finish("a", wire.SessionRewardIn(reward=1.0, reward_parts={"tool": 1.0}))
    assert out["group_sessions"] == 1 and out["submitted"] == 0 and s.state("a") is None
    out = s.finish("b", wire.SessionRewardIn(reward=0.0, reward_parts={"tool": 0.0}))
    assert out["submitted"] == 1 and out["group_sessions"] == 2
    step = manager.next_step()
    (g,) = step.groups
    a, b = g.completions
    assert a.prompt_ids == prompt and a.completion_ids == [10, 11, 20, 21, 12]
    assert a.loss_mask == [1, 1, 0, 0, 1] and a.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert a.versions == [0, 0, 0, 0, 1] and a.policy_version == 0  # the oldest of its generated tokens
    assert b.completion_ids == [13, 14, 15] and b.loss_mask == [1, 1, 1] and b.versions is None
    assert g.rewards == [1.0, 0.0] and g.reward_parts == {"tool": [1.0, 0.0]}
    assert step.environments[ENVIRONMENT]["groups"] == 1


def test_a_turn_that_does_not_extend_the_record_starts_it_over_and_groups_follow_the_header(manager):
    s = Sessions(manager, LIMITS)
    s.add_turn("a", turn([1, 2, 3], [10], 0))
    out = s.add_turn("a", turn([1, 2, 9, 9], [11], 0, continued=True))  # the history was rewritten
    assert out["restarted"] and s.state("a")["tokens"] == [1, 2, 9, 9, 11]
    assert s.status()["counts"]["restarted"] == 1
    t = turn([5, 6], [7], 0).model_copy(update={"group": "task-1"})
    s.add_turn("b", t)
    s.add_turn("c", turn([8], [7], 0).model_copy(update={"group": "task-1"}))  # another prompt, same group
    s.finish("b", wire.SessionRewardIn(reward=1.0))
    assert s.finish("c", wire.SessionRewardIn(reward=0.5))["submitted"] == 1
    (g,) = manager.next_step().groups
    assert [c.prompt_ids for c in g.completions] == [[5, 6], [8]]


def test_what_a_session_end_refuses(manager):
    s = Sessions(manager, LIMITS)
    with pytest.raises(Refused) as e:
        s.finish("nope", wire.SessionRewardIn(reward=1.0))
    assert e.value.status == 404
    s.add_turn("long", turn([1] * 40, [2] * 30, 0))
    with pytest.raises(Refused) as e:
        s.finish("long", wire.SessionRewardIn(reward=1.0))
    assert e.value.reason == "too_long" and "microBatchTokens (64)" in str(e.value)
    s.add_turn("x", turn([1], [2], 0))
    with pytest.raises(Refused) as e:  # no reward, and no job rewards to score it
        s.finish("x", wire.SessionRewardIn())
    assert e.value.reason == "no_reward"


def test_idle_sessions_expire(manager):
    now = [0.0]
    s = Sessions(manager, LIMITS, ttl=10, clock=lambda: now[0])
    s.add_turn("a", turn([1], [2], 0))
    now[0] = 11
    assert s.state("a") is None and s.status()["counts"]["expired"] == 1


def test_a_session_ended_without_a_reward_is_scored_by_the_jobs_rewards(manager, tiny_dir, tokenizer):
    from grpojob.rewards import RewardScorer
    from tests.rollout.harness import make_job

    job = make_job(tiny_dir, rewards=[{"name": "exact_match"}, {"name": "format", "args": {"pattern": "^turn"},
                                                                "weight": 0.5}])
    s = Sessions(manager, LIMITS, scorer=RewardScorer(job.spec, tokenizer), tokenizer=tokenizer)
    s.add_turn("a", turn([1, 2], [10], 0))
    s.add_turn("a", turn([1, 2, 10, 20], [11], 0, continued=True))  # its text: "turn 4"
    out = s.finish("a", wire.SessionRewardIn(row={"answer": "turn 4"}))  # the reference answer for exact_match
    assert out["reward"] == 1.5 and out["reward_parts"] == {"exact_match": 1.0, "format": 1.0}
    s.add_turn("b", turn([1, 2], [12], 0))
    assert s.finish("b", wire.SessionRewardIn(row={"answer": "seven"}))["reward"] == 0.5
    (g,) = manager.next_step().groups
    assert g.rewards == [1.5, 0.5] and g.reward_parts == {"exact_match": [1.0, 0.0], "format": [1.0, 1.0]}


def test_session_turns_sample_as_the_job_does():
    from grpojob.api.data import SamplingSpec
    from grpojob.rollout.sessions import Capture, SessionError, SessionStore
    from grpojob.contracts.rollout import SamplingParams

    job = SamplingSpec(temperature=0.7, top_p=0.9, top_k=20, max_tokens=64)
    got = Capture.sampling(SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=8, seed=3), job)
    assert got == SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=8, seed=3)
    store = SessionStore(None, "t")
    assert Capture.of({}, 1, store) is None
    c = Capture.of({"X-Session-Id": "s-1", "X-Session-Group": "g", "X-Session-Environment": "calc"}, 1, store)
    assert (c.sid, c.group, c.environment) == ("s-1", "g", "calc")
    for headers, n, words in (({"X-Session-Id": "bad id"}, 1, "not a session id"), ({"X-Session-Id": "s"}, 2, "n=1"),
                              ({"X-Session-Id": "s", "X-Session-Environment": "Calc"}, 1, "environment name")):
        with pytest.raises(SessionError, match=words):
            Capture.of(headers, n, store)
