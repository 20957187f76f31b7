"""Tool calling on /v1/chat/completions, through the model's own chat template.

- In: `tools` (OpenAI function tools) are handed to `tokenizer.apply_chat_template(tools=...)`, so
  the model sees them as its template describes them; assistant messages' `tool_calls` and `tool`
  messages are handed over too, with each call's `arguments` as a dict (as vLLM hands them to
  templates, which render them with `tojson`).
- Out: tool calls in the Hermes format, the one Qwen2.5, Qwen3, Hermes and many other templates
  teach: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call. When every
  block parses, the choice gets `message.tool_calls` (arguments as a JSON string, ids `call_...`),
  the text before the first block as `content` (null when empty) and finish_reason `tool_calls`;
  when one does not, nothing is parsed and the whole text stays `content` (as vLLM's hermes parser
  does). `tool_choice` `auto` (the default with tools) and `none` (tools shown, nothing parsed) are
  supported; forcing a call (`required`, a named function) needs guided decoding: a 400.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any, Optional

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
OPEN = "<tool_call>"
MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def check_choice(tool_choice: Any) -> Optional[str]:
    """Why a tool_choice is not supported, or None."""
    if tool_choice in (None, "auto", "none"):
        return None
    return ("tool_choice: only 'auto' and 'none' are supported (forcing a tool call, 'required' or a named "
            "function, needs guided decoding)")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates take them: the OpenAI keys they read, and every tool call's
    arguments as a dict (a JSON string that does not parse stays a string)."""
    out = []
    for m in messages:
        msg = {k: v for k, v in m.items() if k in MESSAGE_KEYS and v is not None}
        if isinstance(msg.get("content"), list):  # content parts: the text ones, joined
            msg["content"] = "".join(p.get("text", "") for p in msg["content"] if isinstance(p, dict))
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_template_call(c) for c in msg["tool_calls"]]
        if msg.get("role") == "assistant" and "content" not in msg:
            msg["content"] = ""
        out.append(msg)
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass
    return {**call, "function": fn}


def parse(text: str) -> tuple[Optional[str], list[dict[str, Any]]]:
    """(content, tool_calls) of a completion's text, Hermes format (see the module doc)."""
    if OPEN not in text:
        return text, []
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            doc = json.loads(body)
        except ValueError:
            return text, []
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            return text, []
        args = doc.get("arguments", doc.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": doc["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
    if not calls:
        return text, []
    content = text[:text.index(OPEN)].strip()
    return content or None, calls
