"""Token-in endpoints in the shapes other libraries' clients speak, over the same engine.

- `POST /inference/v1/generate` (vLLM's, which prime-rl and verifiers' train client call through
  `renderers.client.generate`): `{"model", "token_ids": [int], "sampling_params": {"temperature",
  "top_p", "top_k", "max_tokens", "seed", "n", "stop_token_ids", "logprobs": 1, ...}}` ->
  `{"request_id", "prompt_token_ids", "choices": [{"index", "token_ids", "finish_reason",
  "logprobs": {"content": [{"token": "token_id:<id>", "logprob": x}]}, "policy_version"}],
  "policy_version", "usage"}`.
- `POST /vllm/generate` and `GET /vllm/health` (vLLM's `api_server` `/generate`, which Atropos's
  `--openai.server_type vllm` calls at `{base_url without /v1}/generate`): `{"prompt":
  {"prompt_token_ids": [int]} | "text", "logprobs": 0, "n", "max_tokens", "temperature", "top_p",
  "top_k", "seed", "stop_token_ids"}` -> `{"text": [..], "prompt", "finish_reasons": [..],
  "logprobs": [[[{"<id>": lp}], ...] per choice], "prompt_token_ids", "token_ids": [[..]],
  "policy_versions": [..]}`. It lives under `/vllm` because `/generate` is the trainer's own (see
  server.py); `/vllm/v1/...` serves the OpenAI endpoints too, so an Atropos
  `--openai.base_url http://<rollout>:<port>/vllm/v1` reaches everything it calls.

- `GET /vllm/tokenizer` -> `{"files": {name: base64 of its bytes}}`: the engine's tokenizer as
  `save_pretrained` writes it (tokenizer.json, tokenizer_config.json with the chat template, ...).
  An environment that applies the chat template itself (Atropos) fetches it from here where its
  pod has no model files (`python -m grpojob.integrations.atropos` does).

- `POST /vllm/versions {"sequences": [[int]]}` -> `{"versions": [[int] | null]}`: the policy
  version of each token of a sequence (prompt + completion) this server generated through the two
  endpoints above or `/v1/chat/completions` with `return_token_ids`, null for one it did not (or forgot: it keeps the last RECORDS). Atropos's
  ScoredData carry no versions; the trainer leader looks them up here (never guesses).

Sampling parameters these engines do not have (repetition_penalty, min_p, ...) are ignored, as the
OpenAI endpoints ignore unknown fields; `stop_token_ids` cut a completion after the first one
(kept in token_ids, as vLLM keeps a stop token). Every path needs the job's token, as the rest.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import tempfile
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional, Union

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from grpojob.contracts.rollout import Completion, SamplingParams
from grpojob.rollout.engine import Refused
from grpojob.rollout.openai_api import SamplingFields

VLLM_PREFIX = "/vllm"
RECORDS = 1 << 16  # generations remembered for /vllm/versions (a few steps' worth of groups)


def sequence_key(ids: list[int]) -> bytes:
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=16).digest()


class Generated:
    """What this server generated through the token endpoints: sequence -> per-token versions."""

    def __init__(self, capacity: int = RECORDS):
        self.capacity = capacity
        self._seen: "OrderedDict[bytes, list[int]]" = OrderedDict()

    def add(self, prompt: list[int], c: Completion) -> None:
        self._seen[sequence_key(prompt + c.completion_ids)] = c.versions or [c.policy_version] * len(c.completion_ids)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def versions(self, sequence: list[int]) -> Optional[list[int]]:
        return self._seen.get(sequence_key(sequence))


class VersionsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequences: list[list[int]] = Field(max_length=4096)


class _Sampling(SamplingFields):
    stop_token_ids: Optional[list[int]] = None

    def params(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens or default_max_tokens, seed=self.seed)


class TokenGenerateIn(BaseModel):
    """prime-rl's /inference/v1/generate body."""
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    token_ids: list[int] = Field(min_length=1)
    sampling_params: _Sampling = Field(default_factory=_Sampling)


class _TokensPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_token_ids: list[int] = Field(min_length=1)


class VllmGenerateIn(_Sampling):
    """vLLM api_server's /generate body: the prompt and SamplingParams' fields side by side."""
    prompt: Union[_TokensPrompt, str]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    stream: bool = False


def cut_at_stop_tokens(c: Completion, stop_ids: Optional[list[int]]) -> Completion:
    """The completion up to and including its first stop token (vLLM's stop_token_ids)."""
    stops = set(stop_ids or ())
    hit = next((i for i, t in enumerate(c.completion_ids) if t in stops), None)
    if hit is None or hit == len(c.completion_ids) - 1 and c.finish_reason == "stop":
        return c
    k = hit + 1
    versions = c.versions[:k] if c.versions else None
    return Completion(prompt_ids=c.prompt_ids, completion_ids=c.completion_ids[:k], logprobs=c.logprobs[:k],
                      policy_version=min(versions) if versions else c.policy_version, finish_reason="stop",
                      versions=versions)


class TokenRoutes:
    """The routes above, on a grpojob.rollout.server.Server."""

    def __init__(self, server):
        self.server = server
        self.generated = Generated()
        self._tokenizer: Optional[dict[str, str]] = None  # GET /vllm/tokenizer's files, made once

    def routes(self, openai_routes: list[tuple[str, str, Any]]) -> list:
        """`openai_routes`: (method, path, handler) of the server's /v1 endpoints, also served under /vllm."""
        p = VLLM_PREFIX
        return [web.post("/inference/v1/generate", self.token_generate),
                web.post(f"{p}/generate", self.vllm_generate), web.get(f"{p}/health", self.health),
                web.post(f"{p}/versions", self.versions), web.get(f"{p}/tokenizer", self.tokenizer_files),
                *(web.route(m, p + path, h) for m, path, h in openai_routes)]

    async def _completions(self, prompt: list[int], s: _Sampling) -> list[Completion]:
        srv = self.server
        out = await srv._run(prompt, s.n, s.params(srv.sampling.max_tokens))
        out = [cut_at_stop_tokens(c, s.stop_token_ids) for c in out]
        for c in out:
            self.generated.add(prompt, c)
        return out

    async def _generate(self, request: web.Request, model, prompt_of):
        """(body, prompt, completions, None) or (.., the error response)."""
        srv = self.server
        body, err = await srv._body(request, model, openai=True)
        if err is None:
            err = srv._unavailable(openai=True)
        if err is not None:
            return None, None, None, err
        prompt = prompt_of(body)
        try:
            out = await self._completions(prompt, body.sampling_params if model is TokenGenerateIn else body)
        except Refused as e:
            return None, None, None, srv._error(e.status, str(e), e.result, openai=True)
        srv.metrics["grpojob_rollout_requests_total"].labels(result="ok").inc()
        return body, prompt, out, None

    async def token_generate(self, request: web.Request) -> web.Response:
        body, prompt, out, err = await self._generate(request, TokenGenerateIn, lambda b: list(b.token_ids))
        if err is not None:
            return err
        choices = [{"index": i, "token_ids": c.completion_ids, "finish_reason": c.finish_reason,
                    "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp}
                                             for t, lp in zip(c.completion_ids, c.logprobs)]},
                    "policy_version": c.policy_version, **_token_versions(c)} for i, c in enumerate(out)]
        return web.json_response({
            "request_id": f"gen-{uuid.uuid4().hex}", "prompt_token_ids": prompt, "choices": choices,
            "policy_version": min(c.policy_version for c in out),
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": sum(len(c.completion_ids) for c in out),
                      "total_tokens": len(prompt) + sum(len(c.completion_ids) for c in out)}})

    async def vllm_generate(self, request: web.Request) -> web.Response:
        tok = self.server.engine.tokenizer

        def prompt_of(b: VllmGenerateIn) -> list[int]:
            if isinstance(b.prompt, str):
                return list(tok(b.prompt, add_special_tokens=False)["input_ids"])
            return list(b.prompt.prompt_token_ids)

        body, prompt, out, err = await self._generate(request, VllmGenerateIn, prompt_of)
        if err is not None:
            return err
        if body.stream:
            return self.server._error(400, "stream: streaming /generate is not supported", "bad_request",
                                      openai=True)
        texts = [tok.decode(c.completion_ids, skip_special_tokens=True) for c in out]
        resp: dict[str, Any] = {"text": texts, "prompt": tok.decode(prompt), "finish_reasons":
                                [c.finish_reason for c in out], "policy_versions": [c.policy_version for c in out]}
        if body.logprobs is not None:
            resp["logprobs"] = [[[{str(t): lp}] for t, lp in zip(c.completion_ids, c.logprobs)] for c in out]
            resp["prompt_token_ids"] = prompt
            resp["token_ids"] = [c.completion_ids for c in out]
        return web.json_response(resp)

    async def versions(self, request: web.Request) -> web.Response:
        body, err = await self.server._body(request, VersionsIn, openai=True)
        if err is not None:
            return err
        return web.json_response({"versions": [self.generated.versions(seq) for seq in body.sequences]})

    async def tokenizer_files(self, request: web.Request) -> web.Response:
        srv = self.server
        tok = srv.engine.tokenizer if srv.started else None
        if tok is None:
            return srv._error(503, srv.not_ready_reason() or "the engine has not loaded its tokenizer", "unavailable",
                              openai=True)
        if self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(_saved, tok)
        return web.json_response({"files": self._tokenizer})

    async def health(self, request: web.Request) -> web.Response:
        """vLLM's /health: 200 while the engine can generate (Atropos polls it before it sends)."""
        srv = self.server
        up = srv.started and not srv.draining and not srv.broken()
        reason = None if up else srv.not_ready_reason() or "the engine cannot generate"
        return web.json_response({"ok": reason is None, "reason": reason}, status=503 if reason else 200)


def _token_versions(c: Completion) -> dict:
    return {"token_versions": c.versions} if c.versions is not None else {}


def _saved(tokenizer) -> dict[str, str]:
    """The files `save_pretrained` writes for a tokenizer, base64 by name."""
    with tempfile.TemporaryDirectory() as d:
        tokenizer.save_pretrained(d)
        return {f.name: base64.b64encode(f.read_bytes()).decode() for f in sorted(Path(d).iterdir()) if f.is_file()}
