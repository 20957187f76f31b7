"""OpenAI-compatible `/v1/completions`, `/v1/chat/completions` and `/v1/models` over an engine.

So a user's multi-turn or tool-using workflow can drive the policy with any OpenAI client. The
`model` field of requests is not checked (one model is served; `/v1/models` names it).
Supported: n, max_tokens (max_completion_tokens), temperature, top_p, top_k, seed, stop
(applied to the finished text), logprobs (the sampled tokens' log-probs only). Extensions:
- `return_token_ids: true` (as vLLM) adds `prompt_token_ids` and `token_ids` to each choice: the
  exact tokens an environment submits to the trajectory API, with the choice's log-probs
  (`logprobs.token_logprobs` of /v1/completions, `logprobs.content[].logprob` of chat), which are
  log softmax(logits / temperature) of each sampled token, the quantity the trainer recomputes;
- every choice carries `policy_version` (the oldest version among its tokens) and the response
  the oldest of all; with return_token_ids, a choice whose tokens came from several versions (a
  weight push landed mid-generation, algorithm.partialRollouts) adds `token_versions`, one per token;
  chat responses also carry `prompt_token_ids` at the top level, where vLLM puts it (verifiers
  <= 0.3 reads it there);
- `return_tokens_as_token_ids: true` (as vLLM): every token of the log-prob entries is written
  `"token_id:<id>"` (ART and verifiers read the ids so, exactly, without re-tokenising);
- `/v1/models` gives `max_model_len` (vLLM's extension; renderers' pre-flight length check reads it).
- `tools` on chat: through the model's chat template, calls parsed in the Hermes format
  (openai_tools); `stream: true`: server-sent events in OpenAI's chunk format (openai_stream), sent
  once the completion is generated (the engines return whole completions);
- `X-Session-Id` (header): the turns of one agent session are recorded for training (sessions.py).
Not supported (a 400 that says so): echo, tool_choice other than auto and none.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from grpojob.rollout import openai_tools as tools_api
from grpojob.contracts.rollout import Completion, SamplingParams


class SamplingFields(BaseModel):
    """The sampling fields every endpoint takes (the OpenAI ones, and token_api's)."""
    model_config = ConfigDict(extra="ignore")
    n: int = Field(1, ge=1, le=256)
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    seed: Optional[int] = None


class _Common(SamplingFields):
    model: Optional[str] = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False

    def token_text(self, tokenizer, token_id: int) -> str:
        """A log-prob entry's token: its text, or `token_id:<id>` (return_tokens_as_token_ids)."""
        return f"token_id:{token_id}" if self.return_tokens_as_token_ids else tokenizer.decode([token_id])

    def unsupported(self) -> Optional[str]:
        return None

    @property
    def include_usage(self) -> bool:
        """stream_options.include_usage: a last chunk with the usage."""
        return bool((self.stream_options or {}).get("include_usage"))

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens or default_max_tokens, seed=self.seed)

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else [s for s in (self.stop or []) if s]


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False

    def unsupported(self) -> Optional[str]:
        if self.echo:
            return "echo: echoing the prompt is not supported"
        return super().unsupported()

    def prompts(self, tokenizer) -> list[list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [tokenizer.encode(p, add_special_tokens=False)]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return [tokenizer.encode(x, add_special_tokens=False) if isinstance(x, str) else list(x) for x in p]


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None

    def unsupported(self) -> Optional[str]:
        return tools_api.check_choice(self.tool_choice) or super().unsupported()

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        s = super().sampling(default_max_tokens)
        if self.max_completion_tokens and not self.max_tokens:
            s = SamplingParams(s.temperature, s.top_p, s.top_k, self.max_completion_tokens, s.seed)
        return s

    def render(self, tokenizer, messages: Optional[list[dict[str, Any]]] = None, generation: bool = True) -> str:
        """The conversation (default: the request's) as the chat template writes it, tools included."""
        msgs = tools_api.template_messages(self.messages if messages is None else messages)
        return tokenizer.apply_chat_template(msgs, tools=self.tools or None, add_generation_prompt=generation,
                                             tokenize=False)

    def prompt_ids(self, tokenizer) -> list[int]:
        return encode(tokenizer, self.render(tokenizer))


def encode(tokenizer, text: str) -> list[int]:
    """Rendered text to token ids (what apply_chat_template(tokenize=True) does: no special tokens added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def apply_stop(c: Completion, stops: list[str], tokenizer) -> tuple[str, list[int], list[float], str]:
    """Cut a finished completion at its first stop string: (text, ids, logprobs, finish_reason).
    The ids keep the token in which the stop string begins."""
    text = c.text
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
        return text, c.completion_ids, c.logprobs, c.finish_reason
    cut = min(hits)
    for k in range(1, len(c.completion_ids) + 1):
        if len(tokenizer.decode(c.completion_ids[:k], skip_special_tokens=True)) > cut:
            return text[:cut], c.completion_ids[:k], c.logprobs[:k], "stop"
    return text[:cut], c.completion_ids, c.logprobs, "stop"


def served(c: Completion, stops: list[str], tokenizer) -> Completion:
    """The completion as the client got it: cut at its first stop string (ids, log-probs, versions)."""
    text, ids, lps, finish = apply_stop(c, stops, tokenizer)
    return Completion(prompt_ids=c.prompt_ids, completion_ids=list(ids), logprobs=list(lps),
                      policy_version=min(c.versions[:len(ids)]) if c.versions and ids else c.policy_version,
                      finish_reason=finish, text=text, versions=c.versions[:len(ids)] if c.versions else None)


def _versions(choice: dict[str, Any], c: Completion, ids: list[int], token_ids: bool) -> None:
    """The choice's policy version(s) (see the module docstring)."""
    choice["policy_version"] = min(c.versions[:len(ids)]) if c.versions and ids else c.policy_version
    if token_ids and c.versions is not None:
        choice["token_versions"] = c.versions[:len(ids)]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(req: CompletionRequest, prompts: list[list[int]],
                        results: list[list[Completion]], tokenizer, model: str) -> dict:
    choices, generated, version = [], 0, None
    for p, group in zip(prompts, results):
        for c in group:
            text, ids, lps, finish = apply_stop(c, req.stops(), tokenizer)
            choice: dict[str, Any] = {"index": len(choices), "text": text, "finish_reason": finish,
                                      "logprobs": None}
            if req.logprobs is not None:
                tokens = [req.token_text(tokenizer, t) for t in ids]
                offsets, pos = [], 0
                for t in tokens:
                    offsets.append(pos)
                    pos += len(t)
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
                                      "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, lps)]}
            if req.return_token_ids:
                choice["prompt_token_ids"], choice["token_ids"] = p, ids
            _versions(choice, c, ids, req.return_token_ids)
            choices.append(choice)
            generated += len(ids)
            version = c.policy_version if version is None else min(version, c.policy_version)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "policy_version": version,
            "usage": _usage(sum(len(p) for p in prompts) * req.n, generated)}


def chat_response(req: ChatRequest, prompt: list[int], group: list[Completion], tokenizer, model: str) -> dict:
    choices, generated = [], 0
    for c in group:
        text, ids, lps, finish = apply_stop(c, req.stops(), tokenizer)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if req.parses_tools:
            content, calls = tools_api.parse(text)
            if calls:
                message, finish = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        choice: dict[str, Any] = {"index": len(choices), "finish_reason": finish, "logprobs": None,
                                  "message": message}
        if req.logprobs:
            choice["logprobs"] = {"content": [
                {"token": (tok := req.token_text(tokenizer, t)), "logprob": lp,
                 "bytes": list(tok.encode()), "top_logprobs": []} for t, lp in zip(ids, lps)]}
        if req.return_token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = prompt, ids
        _versions(choice, c, ids, req.return_token_ids)
        choices.append(choice)
        generated += len(ids)
    resp = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices,
            "policy_version": min((c.policy_version for c in group), default=None),
            "usage": _usage(len(prompt), generated)}
    if req.return_token_ids:
        resp["prompt_token_ids"] = prompt
    return resp


def models_response(model: str, max_model_len: Optional[int] = None) -> dict:
    card = {"id": model, "object": "model", "created": 0, "owned_by": "grpojob"}
    if max_model_len:
        card["max_model_len"] = max_model_len
    return {"object": "list", "data": [card]}
