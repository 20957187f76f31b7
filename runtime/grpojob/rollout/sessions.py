"""Agent sessions on the rollout servers' OpenAI endpoints: the turns of a client that sends
`X-Session-Id` are recorded for training, with the exact tokens the model saw.

A session is one trajectory: every turn asks for one completion (n=1). The session's record lives
on the trainer leader (grpojob.leader.trajectories.sessions, behind the trajectory API), so any rollout
server can serve any turn. For each turn a server:

1. reads the session's record (its tokens so far, the prompt of its last turn as text);
2. builds this turn's prompt. Chat: when the request's messages are the last turn's messages (the
   chat template renders them to the same text as then), then one assistant message, then new
   messages, the prompt is the session's tokens as served (the last prompt and the completion the
   model generated, never re-tokenised) + the template's end of the assistant turn (the part the
   completion did not already end with, e.g. `<|im_end|>`) + the new messages as the template
   renders them. Text (/v1/completions, one string prompt): when the prompt starts with the last
   prompt + the text returned for it, the session's tokens + the rest. Otherwise the session starts
   over from this prompt (a client that rewrote its history; the earlier turns are dropped);
3. generates, and posts the turn (the prompt tokens, the completion's tokens, log-probs and
   versions) to the trainer, which appends the new context tokens (loss mask 0) and the completion
   (loss mask 1).

`X-Session-Group` (first turn) names the GRPO group the session belongs to; without it, sessions
that started from the same prompt form a group. `X-Session-Environment` names the environment
its groups are trained as (metrics show them under it; default `sessions`). Every turn is sampled
with the job's rollout.sampling temperature, top_p and top_k, whatever the request asks: the
trainer recomputes the log-probs at those (max_tokens, stop and seed are the request's).
`POST /v1/sessions/{id}/reward` ends a session with a reward (or with none: the job's rewards
score it) and is passed on to the trainer.
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Optional

import aiohttp

from grpojob.rollout.openai_api import ChatRequest, encode
from grpojob.contracts.rollout import Completion, SamplingParams

SESSION_HEADER = "X-Session-Id"
GROUP_HEADER = "X-Session-Group"
ENVIRONMENT_HEADER = "X-Session-Environment"
ENVIRONMENT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # as environments' names
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
PROBE = "\x00grpojob-probe\x00"  # an assistant reply no template changes, to find the end of a turn


class SessionError(ValueError):
    """A session request that cannot be served: the HTTP status and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Prompt:
    ids: list[int]
    rendered: str  # the prompt as text: the template's (chat) or the client's (text)
    continued: bool  # it extends the session's tokens


def check_id(value: str, header: str) -> str:
    if not SESSION_ID.match(value):
        raise SessionError(400, f"{header}: '{value[:40]}' is not a session id (1-128 letters, digits, '.', '_', "
                                "':', '-', starting with a letter or digit)")
    return value


def _turn_end(req: ChatRequest, tokenizer, history: list[dict[str, Any]], prompt: str) -> str:
    """What the template writes after an assistant reply's text (e.g. `<|im_end|>\\n`)."""
    probe = req.render(tokenizer, history + [{"role": "assistant", "content": PROBE}], generation=False)
    turn = probe[len(prompt):] if probe.startswith(prompt) else ""
    return turn[turn.index(PROBE) + len(PROBE):] if PROBE in turn else ""


def _uncovered(tail: str, completion: list[int], tokenizer) -> str:
    """The part of `tail` the completion did not already end with (its last tokens, e.g. the
    end-of-turn token the model emitted itself)."""
    covered = ""
    for m in range(1, min(4, len(completion)) + 1):
        piece = tokenizer.decode(completion[-m:], skip_special_tokens=False)
        if not tail.startswith(piece):
            break
        covered = piece
    return tail[len(covered):]


def chat_prompt(state: Optional[dict[str, Any]], req: ChatRequest, tokenizer) -> Prompt:
    """This chat turn's prompt (see the module doc)."""
    full = req.render(tokenizer)
    fresh = Prompt(encode(tokenizer, full), full, False)
    if state is None or state.get("mode") != "chat":
        return fresh
    n, msgs = int(state["messages"]), req.messages
    if len(msgs) <= n + 1 or msgs[n].get("role") != "assistant":
        return fresh
    last = req.render(tokenizer, msgs[:n])
    if last != state["rendered"]:  # the history before the reply changed
        return fresh
    replied = req.render(tokenizer, msgs[:n + 1], generation=False)
    if not (replied.startswith(last) and full.startswith(replied)):
        return fresh
    tokens = list(state["tokens"])
    tail = _uncovered(_turn_end(req, tokenizer, msgs[:n], last), tokens[int(state["prompt_length"]):], tokenizer)
    return Prompt(tokens + encode(tokenizer, tail + full[len(replied):]), full, True)


def text_prompt(state: Optional[dict[str, Any]], prompt: str, tokenizer) -> Prompt:
    """This /v1/completions turn's prompt (see the module doc)."""
    if state is not None and state.get("mode") == "text":
        before = state["rendered"] + state["returned"]
        if prompt.startswith(before) and len(prompt) > len(before):
            return Prompt(list(state["tokens"]) + encode(tokenizer, prompt[len(before):]), prompt, True)
    return Prompt(encode(tokenizer, prompt), prompt, False)


class SessionStore:
    """The trainer's session records, over its trajectory API (`url`: GRPOJOB_TRAJECTORY_URL)."""

    def __init__(self, url: Optional[str], token: str, timeout: float = 60.0):
        self.url, self.timeout = (url or "").rstrip("/"), timeout
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http: Optional[aiohttp.ClientSession] = None

    async def _call(self, method: str, path: str, body: Optional[dict] = None) -> tuple[int, dict]:
        if not self.url:
            raise SessionError(400, f"{SESSION_HEADER}: sessions are recorded by the trainer, and this rollout "
                                    "server has no trajectory API (GRPOJOB_TRAJECTORY_URL is not set)")
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(headers=self._headers)
        try:
            async with self._http.request(method, self.url + path, json=body,
                                          timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                return r.status, await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise SessionError(503, f"session capture: the trainer's trajectory API at {self.url} did not answer "
                                    f"({type(e).__name__}: {e}); retry") from None

    async def state(self, sid: str) -> Optional[dict[str, Any]]:
        status, doc = await self._call("GET", f"/sessions/{sid}")
        if status == 404:
            return None
        if status != 200:
            raise SessionError(status, f"session {sid}: {doc.get('error', doc)}")
        return doc

    async def record(self, sid: str, turn: dict[str, Any]) -> None:
        status, doc = await self._call("POST", f"/sessions/{sid}/turns", turn)
        if status != 200:
            raise SessionError(status, f"session {sid}: the trainer refused the turn: {doc.get('error', doc)}")

    async def reward(self, sid: str, body: Any) -> tuple[int, dict]:
        return await self._call("POST", f"/sessions/{sid}/reward", body)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def turn(mode: str, group: Optional[str], environment: Optional[str], prompt: Prompt, c: Completion, returned: str,
         messages: int) -> dict:
    """The body of one turn as the trainer takes it (grpojob.leader.trajectories.wire.SessionTurnIn)."""
    return {"mode": mode, "group": group, "environment": environment, "prompt_ids": prompt.ids,
            "continued": prompt.continued, "rendered": prompt.rendered, "returned": returned, "messages": messages,
            "completion": {"token_ids": c.completion_ids, "logprobs": c.logprobs, "policy_version": c.policy_version,
                           "versions": c.versions, "finish_reason": c.finish_reason, "text": c.text}}


class Capture:
    """One request's session: its prompt from the record, then the turn back to the record."""

    def __init__(self, store: SessionStore, sid: str, group: Optional[str], environment: Optional[str] = None):
        self.store, self.sid, self.group, self.environment = store, sid, group, environment
        self.mode = "chat"

    @classmethod
    def of(cls, headers, n: int, store: SessionStore) -> Optional["Capture"]:
        """The request's session (None without X-Session-Id); SessionError for a bad one."""
        sid = headers.get(SESSION_HEADER)
        if sid is None:
            return None
        group, env = headers.get(GROUP_HEADER), headers.get(ENVIRONMENT_HEADER)
        if env is not None and not ENVIRONMENT_NAME.match(env):
            raise SessionError(400, f"{ENVIRONMENT_HEADER}: '{env[:70]}' is not an environment name (lower-case "
                                    "letters, digits and '-', at most 63)")
        if n != 1:
            raise SessionError(400, f"n: a session's turn asks for one completion (n=1, got {n}): a session is one "
                                    "trajectory; run groupSize sessions for a group")
        return cls(store, check_id(sid, SESSION_HEADER), check_id(group, GROUP_HEADER) if group else None, env)

    @staticmethod
    def sampling(requested: SamplingParams, job) -> SamplingParams:
        """The job's rollout.sampling (`job`) with the request's max_tokens and seed."""
        return SamplingParams(temperature=job.temperature, top_p=job.top_p, top_k=job.top_k,
                              max_tokens=requested.max_tokens, seed=requested.seed)

    async def chat_prompt(self, req: ChatRequest, tokenizer) -> Prompt:
        self.mode = "chat"
        return chat_prompt(await self.store.state(self.sid), req, tokenizer)

    async def text_prompt(self, prompt: Any, tokenizer) -> Prompt:
        if not isinstance(prompt, str):
            raise SessionError(400, "prompt: a session's /v1/completions turn takes one text prompt")
        self.mode = "text"
        return text_prompt(await self.store.state(self.sid), prompt, tokenizer)

    async def record(self, prompt: Prompt, served: Completion, returned: str, messages: int) -> None:
        await self.store.record(self.sid, turn(self.mode, self.group, self.environment, prompt, served, returned,
                                               messages))
