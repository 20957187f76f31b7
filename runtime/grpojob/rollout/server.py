"""The rollout server's HTTP API, in front of one engine (the process: grpojob.rollout.process).

HTTP API (JSON). Every path but /healthz, /readyz (and /metrics, unless GRPOJOB_METRICS_AUTH) needs
the job's token as `Authorization: Bearer <token>` (grpojob.auth; GRPOJOB_TOKEN_FILE names it): the
OpenAI endpoints take it as the API key. Without it: 401 "unauthorized".
- GET /healthz: 200 as soon as the process serves HTTP (500 once the engine died; the process
  then exits 1, see grpojob.rollout.process).
- GET /readyz: 200 once the engine is up AND it holds the trainer's current weights; 503 with
  the reason otherwise. The engine starts from spec.model.path, which is version 0: a server
  already serves it (/generate works) while it waits for the trainer, but it is ready only once
  the trainer's store confirms that version 0 (or whatever it pushed since) is current. Without
  GRPOJOB_SYNC_ADDR (standalone) it is ready once the engine is up.
- GET /metrics: Prometheus (grpojob.metrics_names.ROLLOUT).
- GET /info: replica, backend, model, policy version, readiness, requests in flight, draining.
- POST /generate: {"prompt_ids": [int], "n": 1, "sampling": {"temperature", "top_p", "top_k",
  "max_tokens", "seed"} (absent: the job's rollout.sampling), "min_version": null} ->
  {"policy_version", "replica", "completions": [{"completion_ids", "logprobs", "policy_version",
  "finish_reason", "text"}]}. 400 for bad input (the message names the field), 409 when the
  server holds a version older than min_version, 503 while the engine loads and once it broke
  (the message is the engine's error), and while it drains after SIGTERM (`"draining": true`:
  it finishes the requests it has and takes no new ones, grpojob.rollout.process.drain).
- POST /v1/completions, POST /v1/chat/completions, GET /v1/models: see openai_api.
- POST /v1/sessions/{id}/reward: ends an agent session (X-Session-Id; sessions.py), passed on to
  the trainer's trajectory API (GRPOJOB_TRAJECTORY_URL), which records every session's turns.
- POST /sleep, POST /wake_up, POST /memory: turn-taking with a colocated trainer, see turns.
- POST /inference/v1/generate (prime-rl's), POST /vllm/generate, GET /vllm/health (vLLM's, for
  Atropos) and /vllm/v1/...: token-in endpoints in other libraries' shapes; GET /vllm/tokenizer
  (the tokenizer's files, for environments without them), see token_api.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict
from typing import Optional

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpojob import prom
from grpojob.auth import Auth, app_key, middleware
from grpojob.failures import describe
from grpojob.api.data import SamplingSpec
from grpojob.metrics_names import ROLLOUT
from grpojob.rollout import engine as engines
from grpojob.rollout import openai_api as oai
from grpojob.rollout import openai_stream
from grpojob.rollout import sessions as agent_sessions
from grpojob.rollout.token_api import TokenRoutes
from grpojob.rollout.turns import Turns
from grpojob.contracts.rollout import SamplingParams

log = logging.getLogger("grpojob.rollout")
DRAINING = ("replica {replica} is draining (stopping): it finishes the requests in flight and takes no new ones")


class SamplingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(256, ge=1)
    seed: Optional[int] = None


class GenerateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_ids: list[int] = Field(min_length=1)
    n: int = Field(1, ge=1, le=4096)
    sampling: Optional[SamplingIn] = None  # None: the job's rollout.sampling
    min_version: Optional[int] = None


class Server:
    """HTTP front of one engine (and its sync agent)."""

    def __init__(self, engine, *, model_path: str, sampling: SamplingSpec, replica: str, auth: Auth,
                 agent=None, trajectory_url: Optional[str] = None):
        """model_path: the model the engine starts from (version 0); sampling: spec.rollout.sampling,
        the defaults of a request that gives none."""
        self.model_path, self.sampling = model_path, sampling
        self.engine = engine
        self.agent = agent
        self.replica = replica
        self.auth = auth
        self.model_name = os.path.basename(os.path.normpath(model_path)) or model_path
        self.started = False
        self.start_error: Optional[str] = None
        self.metrics = prom.build(ROLLOUT, CollectorRegistry())
        self.sessions = agent_sessions.SessionStore(trajectory_url, auth.token)  # agent sessions' records
        self.turns = Turns(self)  # sleep and wake (spec.placement colocated)
        self.tokens = TokenRoutes(self)  # other libraries' token-in endpoints
        self.failing = FailureStreak()  # generate() calls that raise while the engine says it is fine
        self.draining = False  # after SIGTERM: finishes the requests in flight, takes no new ones (process.drain)
        self.inflight = 0  # generate calls in the engine now (every endpoint)
        self.drained = [0, 0]  # requests and completion tokens finished while draining

    # ---- app ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20, middlewares=[middleware()])
        app[app_key()] = self.auth
        openai_routes = [("GET", "/v1/models", self.models), ("POST", "/v1/completions", self.completions),
                         ("POST", "/v1/chat/completions", self.chat),
                         ("POST", "/v1/sessions/{sid}/reward", self.session_reward)]
        app.add_routes([
            web.get("/healthz", self.healthz), web.get("/readyz", self.readyz),
            web.get("/metrics", self.prometheus), web.get("/info", self.info),
            web.post("/generate", self.generate),
            *(web.route(m, path, h) for m, path, h in openai_routes),
            *self.turns.routes(), *self.tokens.routes(openai_routes),
        ])
        return app

    def broken(self) -> Optional[str]:
        """Why the engine cannot serve: it failed, or its generate() keeps raising (FailureStreak)."""
        return self.engine.errored() or self.failing.broken

    def not_ready_reason(self) -> Optional[str]:
        if self.draining:
            return DRAINING.format(replica=self.replica)
        if self.start_error:
            return f"engine failed to start: {self.start_error}"
        if not self.started:
            return f"{self.engine.backend} engine is loading {self.model_path}"
        dead = self.broken()
        if dead:
            return dead
        return self.agent.not_ready_reason() if self.agent else None

    async def healthz(self, request: web.Request) -> web.Response:
        dead = self.start_error or (self.broken() if self.started else None)
        return web.json_response({"status": "failed" if dead else "ok", "error": dead},
                                 status=500 if dead else 200)

    async def readyz(self, request: web.Request) -> web.Response:
        reason = self.not_ready_reason()
        return web.json_response({"ready": reason is None, "reason": reason,
                                  "policy_version": self.engine.version}, status=503 if reason else 200)

    async def info(self, request: web.Request) -> web.Response:
        state = "failed" if self.start_error or (self.started and self.engine.errored()) else \
            "up" if self.started else "loading"
        return web.json_response({"replica": self.replica, "backend": self.engine.backend, "engine": state,
                                  "model": self.model_name, "policy_version": self.engine.version,
                                  "weights": self.engine.weights, "ready": self.not_ready_reason() is None,
                                  "reason": self.not_ready_reason(), "in_flight": self.inflight,
                                  "draining": self.draining})

    async def prometheus(self, request: web.Request) -> web.Response:
        from prometheus_client import generate_latest

        m = self.metrics
        waiting, running = self.engine.load_info() if self.started else (0, 0)
        m["grpojob_rollout_queue_depth"].set(waiting)
        m["grpojob_rollout_running_requests"].set(running)
        m["grpojob_rollout_weight_version"].set(self.engine.version)
        if self.agent and self.agent.last_sync_seconds is not None:
            m["grpojob_rollout_last_sync_seconds"].set(self.agent.last_sync_seconds)
        return web.Response(body=generate_latest(m["_registry"]),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # ---- generation ---------------------------------------------------------------------------
    def _error(self, status: int, message: str, result: str, *, openai: bool = False, **extra) -> web.Response:
        self.metrics["grpojob_rollout_requests_total"].labels(result=result).inc()
        if openai:  # the shape OpenAI clients parse
            kind = "invalid_request_error" if status == 400 else "server_error"
            return web.json_response({"error": {"message": message, "type": kind, "param": None,
                                                "code": status}}, status=status)
        return web.json_response({"error": message, "replica": self.replica, **extra}, status=status)

    async def _body(self, request: web.Request, model: type[BaseModel], openai: bool = False):
        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, self._error(400, "the request body is not JSON", "bad_request", openai=openai)
        try:
            return model.model_validate(doc), None
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
                             for err in e.errors())
            return None, self._error(400, msgs, "bad_request", openai=openai)

    def _unavailable(self, openai: bool = False) -> Optional[web.Response]:
        if self.draining:  # the trainer's client sends it to another server, as no failure
            return self._error(503, DRAINING.format(replica=self.replica), "draining", openai=openai, draining=True)
        if not self.started:
            return self._error(503, self.not_ready_reason() or "engine not started", "unavailable", openai=openai)
        dead = self.broken()
        if dead:
            return self._error(503, dead, "error", openai=openai)
        return None

    async def _run(self, prompt_ids: list[int], n: int, sampling: SamplingParams):
        """Generate, with the request checks and metrics every endpoint shares."""
        limit = self.engine.context_len
        err = engines.check_prompt(prompt_ids, self.engine.vocab_size, limit)
        if err is None and len(prompt_ids) + sampling.max_tokens > limit:
            err = (f"prompt ({len(prompt_ids)} tokens) + max_tokens ({sampling.max_tokens}) exceeds the "
                   f"context length {limit}")
        if err:
            raise _Refused(400, err, "bad_request")
        start = time.perf_counter()
        self.inflight += 1
        try:
            out = await self.engine.generate(prompt_ids, n, sampling)
        except ValueError as e:  # the engine refused these parameters
            raise _Refused(400, str(e), "bad_request") from None
        except Exception as e:  # noqa: BLE001 - every failure becomes a JSON answer that says why
            dead = self.engine.errored()
            if dead:  # the engine broke under this request: 503 with why (the trainer logs it)
                raise _Refused(503, dead, "error") from None
            log.warning("rollout server %s: generate failed: %s", self.replica, describe(e),
                        exc_info=self.failing.count == 0)
            self.failing.failed(describe(e))
            raise _Refused(503 if self.failing.broken else 500,
                           self.failing.broken or f"the {self.engine.backend} engine's generate failed: {describe(e)}",
                           "error") from None
        finally:
            self.inflight -= 1
        self.failing.ok()
        tokens = sum(len(c.completion_ids) for c in out)
        if self.draining:
            self.drained[0] += 1
            self.drained[1] += tokens
        self.metrics["grpojob_rollout_generated_tokens_total"].inc(tokens)
        self.metrics["grpojob_rollout_tokens_per_second"].set(tokens / max(time.perf_counter() - start, 1e-9))
        return out

    async def generate(self, request: web.Request) -> web.Response:
        body, err = await self._body(request, GenerateIn)
        if err:
            return err
        if (resp := self._unavailable()) is not None:
            return resp
        if body.min_version is not None and self.engine.version < body.min_version:
            return self._error(409, f"replica {self.replica} holds policy version {self.engine.version}, "
                               f"older than the required {body.min_version}", "stale",
                               policy_version=self.engine.version)
        s = body.sampling
        sampling = SamplingParams.from_spec(self.sampling) if s is None else \
            SamplingParams(s.temperature, s.top_p, s.top_k, s.max_tokens, s.seed)
        try:
            out = await self._run(body.prompt_ids, body.n, sampling)
        except _Refused as e:
            return self._error(e.status, str(e), e.result)
        self.metrics["grpojob_rollout_requests_total"].labels(result="ok").inc()
        return web.json_response({
            "replica": self.replica, "policy_version": min(c.policy_version for c in out),
            "completions": [{k: v for k, v in asdict(c).items() if k != "prompt_ids"} for c in out]})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(oai.models_response(self.model_name, self.engine.context_len if self.started else None))

    async def _openai_body(self, request: web.Request, cls):
        """(request body, None) or (None, the error response): parse, unsupported options, readiness."""
        body, err = await self._body(request, cls, openai=True)
        if err:
            return None, err
        if (why := body.unsupported()):
            return None, self._error(400, why, "bad_request", openai=True)
        return body, self._unavailable(openai=True)

    async def completions(self, request: web.Request) -> web.Response:
        body, err = await self._openai_body(request, oai.CompletionRequest)
        if err is not None:
            return err
        tok = self.engine.tokenizer
        try:
            capture = agent_sessions.Capture.of(request.headers, body.n, self.sessions)
            prompt = await capture.text_prompt(body.prompt, tok) if capture else None
        except agent_sessions.SessionError as e:
            return self._session_error(e)
        prompts = [prompt.ids] if prompt else body.prompts(tok)
        sampling = body.sampling(self.sampling.max_tokens)
        if capture:
            sampling = capture.sampling(sampling, self.sampling)
        try:
            results = await asyncio.gather(*(self._run(p, body.n, sampling) for p in prompts))
        except _Refused as e:
            return self._error(e.status, str(e), e.result, openai=True)
        resp = oai.completion_response(body, prompts, results, tok, self.model_name)
        if capture and (err := await self._record(capture, prompt, results[0][0], body, resp["choices"][0]["text"])):
            return err
        self.metrics["grpojob_rollout_requests_total"].labels(result="ok").inc()
        return await openai_stream.respond(request, resp, body.stream, body.include_usage)

    async def chat(self, request: web.Request) -> web.Response:
        body, err = await self._openai_body(request, oai.ChatRequest)
        if err is not None:
            return err
        tok = self.engine.tokenizer
        try:
            capture = agent_sessions.Capture.of(request.headers, body.n, self.sessions)
            turn = await capture.chat_prompt(body, tok) if capture else None
            prompt = turn.ids if turn else body.prompt_ids(tok)
        except agent_sessions.SessionError as e:
            return self._session_error(e)
        except Exception as e:  # a template that rejects these messages
            return self._error(400, f"messages: cannot apply the chat template: {e}", "bad_request", openai=True)
        sampling = body.sampling(self.sampling.max_tokens)
        if capture:
            sampling = capture.sampling(sampling, self.sampling)
        try:
            group = await self._run(prompt, body.n, sampling)
        except _Refused as e:
            return self._error(e.status, str(e), e.result, openai=True)
        resp = oai.chat_response(body, prompt, group, tok, self.model_name)
        if body.return_token_ids or capture:  # the tokens as served (a session's too), for /vllm/versions
            for c in group:
                self.tokens.generated.add(prompt, oai.served(c, body.stops(), tok))
        if capture and (err := await self._record(capture, turn, group[0], body,
                                                  resp["choices"][0]["message"]["content"] or "")):
            return err
        self.metrics["grpojob_rollout_requests_total"].labels(result="ok").inc()
        return await openai_stream.respond(request, resp, body.stream, body.include_usage)

    # ---- agent sessions (sessions.py) ---------------------------------------------------------
    def _session_error(self, e: "agent_sessions.SessionError") -> web.Response:
        return self._error(e.status, str(e), "bad_request" if e.status < 500 else "error", openai=True)

    async def _record(self, capture, prompt, c, body, returned: str) -> Optional[web.Response]:
        """The turn to the session's record (what the client got: cut at its stop strings)."""
        served = oai.served(c, body.stops(), self.engine.tokenizer)
        try:
            await capture.record(prompt, served, returned, len(getattr(body, "messages", ())))
        except agent_sessions.SessionError as e:
            return self._session_error(e)
        return None

    async def session_reward(self, request: web.Request) -> web.Response:
        try:
            sid = agent_sessions.check_id(request.match_info["sid"], "path")
            doc = await request.json() if request.can_read_body else {}
            status, out = await self.sessions.reward(sid, doc)
        except agent_sessions.SessionError as e:
            return self._session_error(e)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "the request body is not JSON", "bad_request", openai=True)
        return web.json_response(out, status=status)


class FailureStreak:
    """generate() calls that raise with no success in between. An engine that fails every request
    while it says it is fine (a plug-in's bug, a device gone bad) is broken once FAILURES_IN_A_ROW
    calls over at least STREAK_SECONDS failed: the server turns unready with the error and the
    process ends (grpojob.rollout.process), so its restarts count and the run ends or recovers."""

    FAILURES_IN_A_ROW = 8
    STREAK_SECONDS = 2.0

    def __init__(self):
        self.count, self.since, self.first = 0, 0.0, ""
        self.broken: Optional[str] = None

    def failed(self, error: str) -> None:
        if self.count == 0:
            self.since, self.first = time.monotonic(), error
        self.count += 1
        if self.count >= self.FAILURES_IN_A_ROW and time.monotonic() - self.since >= self.STREAK_SECONDS:
            self.broken = self.broken or (f"the engine's generate failed {self.count} times in a row over "
                                          f"{time.monotonic() - self.since:.0f} s, first with {self.first}")

    def ok(self) -> None:
        self.count = 0


_Refused = engines.Refused
