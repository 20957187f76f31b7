"""Tool calls (Hermes format) and streamed chunks of the OpenAI endpoints, as pure functions."""
from __future__ import annotations

import json

from grpojob.rollout import openai_api as oai
from grpojob.rollout import openai_stream, openai_tools
from grpojob.contracts.rollout import Completion


def test_hermes_tool_calls_are_parsed():
    text = 'let me compute <tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>' \
           '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
    content, calls = openai_tools.parse(text)
    assert content == "let me compute"
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "calculator", {"expression": "3 + 4"}), ("function", "clock", {})]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]


def test_what_does_not_parse_stays_text():
    for text in ("no call", "<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>',
                 "<tool_call> unfinished"):
        assert openai_tools.parse(text) == (text, [])


def test_messages_reach_the_template_with_arguments_as_dicts():
    msgs = openai_tools.template_messages([
        {"role": "assistant", "content": None, "refusal": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "4"}]}])
    assert msgs == [{"role": "assistant", "content": "",
                     "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "4"}]


def test_tool_choice_that_forces_a_call_is_refused():
    assert oai.ChatRequest(messages=[{"role": "user", "content": "x"}], tool_choice="auto").unsupported() is None
    why = oai.ChatRequest(messages=[{"role": "user", "content": "x"}], tool_choice="required").unsupported()
    assert "guided decoding" in why


def test_chat_answer_with_a_tool_call_and_its_chunks(tokenizer):
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    ids = tokenizer.encode(text)
    req = oai.ChatRequest(messages=[{"role": "user", "content": "1+1"}], tools=[{"type": "function", "function": {
        "name": "calculator"}}], stream=True, stream_options={"include_usage": True}, return_token_ids=True)
    resp = oai.chat_response(req, [1, 2], [Completion([1, 2], ids, [-0.1] * len(ids), 3, text=text)], tokenizer, "m")
    choice = resp["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    chunks = openai_stream.chat_chunks(resp, include_usage=True)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    call = chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["function"] == choice["message"]["tool_calls"][0]["function"]
    end = chunks[2]["choices"][0]
    assert end["finish_reason"] == "tool_calls" and end["token_ids"] == ids and end["policy_version"] == 3
    assert chunks[3]["choices"] == [] and chunks[3]["usage"] == resp["usage"]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["id"] for c in chunks} == {resp["id"]}
    # tool_choice none: the tools are shown, the text is not parsed
    plain = oai.chat_response(req.model_copy(update={"tool_choice": "none"}), [1, 2],
                              [Completion([1, 2], ids, [-0.1] * len(ids), 3, text=text)], tokenizer, "m")
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": text}
