"""`stream: true` on the OpenAI endpoints: the response as server-sent events in OpenAI's chunk
format (`data: {chunk}` lines, then `data: [DONE]`), which OpenAI clients iterate.

The engines hand back whole completions, so the events are sent once the completion is generated:
per choice a role chunk (chat), its text (with its log-probs), its tool calls (chat), then a chunk
with its finish_reason and the grpojob extensions (`policy_version`, with return_token_ids
`prompt_token_ids`, `token_ids`, `token_versions`); with `stream_options.include_usage` a last chunk
with the usage and no choices.
"""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web

_PARTS = ("index", "message", "text", "logprobs", "finish_reason")


def _extras(choice: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in choice.items() if k not in _PARTS}


def chat_chunks(resp: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    base = {"id": resp["id"], "object": "chat.completion.chunk", "created": resp["created"], "model": resp["model"]}

    def chunk(i: int, delta: dict[str, Any], **rest: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None, **rest}]}

    out = []
    for ch in resp["choices"]:
        i, msg = ch["index"], ch["message"]
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        if msg.get("content"):
            out.append(chunk(i, {"content": msg["content"]}, logprobs=ch["logprobs"]))
        for j, call in enumerate(msg.get("tool_calls") or ()):
            out.append(chunk(i, {"tool_calls": [{"index": j, **call}]}))
        out.append(chunk(i, {}, finish_reason=ch["finish_reason"], **_extras(ch)))
    if include_usage:
        out.append({**base, "choices": [], "usage": resp["usage"]})
    return out


def completion_chunks(resp: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    base = {"id": resp["id"], "object": "text_completion", "created": resp["created"], "model": resp["model"]}
    out = []
    for ch in resp["choices"]:
        out.append({**base, "choices": [{"index": ch["index"], "text": ch["text"], "logprobs": ch["logprobs"],
                                         "finish_reason": None}]})
        out.append({**base, "choices": [{"index": ch["index"], "text": "", "logprobs": None,
                                         "finish_reason": ch["finish_reason"], **_extras(ch)}]})
    if include_usage:
        out.append({**base, "choices": [], "usage": resp["usage"]})
    return out


async def respond(request: web.Request, resp: dict[str, Any], stream: bool, include_usage: bool) -> web.StreamResponse:
    """The response as JSON, or (stream) as server-sent events."""
    if not stream:
        return web.json_response(resp)
    chunks = chat_chunks if resp["object"] == "chat.completion" else completion_chunks
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    for c in chunks(resp, include_usage):
        await out.write(f"data: {json.dumps(c)}\n\n".encode())
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()
    return out
