"""A judge server's HTTP API, in front of one judge model (the process: grpojob.judge.process).

Every path but /healthz, /readyz (and /metrics, unless GRPOJOB_METRICS_AUTH) needs the job's token
as `Authorization: Bearer <token>` (grpojob.auth), as the rollout servers do.
- GET /healthz: 200 while the process serves HTTP (500 once the model failed to load).
- GET /readyz: 200 once the model is loaded; 503 with the reason before.
- GET /metrics: Prometheus (grpojob.metrics_names.JUDGE): queue depth, request time, batch sizes.
- POST /score: {"items": [{"prompt": str, "completion": str}, ...]} -> {"scores": [float, ...]},
  one per item, in order. Each item becomes what the model reads (the judge's template filled in; a
  generative judge's chat); concurrent requests are batched together up to maxBatchSize items a
  pass. A score is null where a generative judge's answer had none the parser could read
  (grpojob_judge_unparsed_total counts them; the trainer applies onFailure). 400: a malformed body
  (the message names the field); 503: the model is not loaded (yet, or it failed).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpojob import prom
from grpojob.api.judge import JudgeSpec
from grpojob.auth import Auth, app_key, middleware
from grpojob.judge.engine import Judge
from grpojob.metrics_names import JUDGE

log = logging.getLogger("grpojob.judge")
MAX_ITEMS = 4096  # items one request may carry


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = ""
    completion: str


class ScoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = Field(min_length=1, max_length=MAX_ITEMS)


class Batcher:
    """Concurrent requests' texts, scored together: one forward pass at a time (in a thread, so
    the HTTP loop keeps answering), up to `max_batch` texts each."""

    def __init__(self, judge: Judge, max_batch: int, metrics: dict):
        self.judge, self.max_batch, self.metrics = judge, max_batch, metrics
        self._queue: list[tuple[list, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._task: Optional[asyncio.Task] = None

    @property
    def depth(self) -> int:
        return sum(len(texts) for texts, _ in self._queue)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._work())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        for _, fut in self._queue:
            if not fut.done():
                fut.set_exception(RuntimeError("the judge server is stopping"))

    async def score(self, texts: list) -> list[Optional[float]]:
        loop = asyncio.get_running_loop()
        futures = []
        for i in range(0, len(texts), self.max_batch):
            fut = loop.create_future()
            self._queue.append((texts[i:i + self.max_batch], fut))
            futures.append(fut)
        self.metrics["grpojob_judge_queue_depth"].set(self.depth)
        self._wake.set()
        return [s for part in await asyncio.gather(*futures) for s in part]

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                take, n = [], 0
                while self._queue and n + len(self._queue[0][0]) <= self.max_batch:
                    entry = self._queue.pop(0)
                    take.append(entry)
                    n += len(entry[0])
                self.metrics["grpojob_judge_queue_depth"].set(self.depth)
                texts = [t for part, _ in take for t in part]
                try:
                    scores = await asyncio.to_thread(self.judge.score, texts)
                except Exception as e:  # noqa: BLE001 - every waiting request learns why
                    log.exception("judge: scoring %d texts failed", len(texts))
                    for _, fut in take:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                self.metrics["grpojob_judge_batch_size"].observe(len(texts))
                self.metrics["grpojob_judge_scored_total"].inc(len(texts))
                at = 0
                for part, fut in take:
                    if not fut.done():
                        fut.set_result(scores[at:at + len(part)])
                    at += len(part)


class Server:
    def __init__(self, spec: JudgeSpec, auth: Auth, replica: str):
        self.spec, self.auth, self.replica = spec, auth, replica
        self.metrics = prom.build(JUDGE, CollectorRegistry())
        self.batcher: Optional[Batcher] = None
        self.start_error: Optional[str] = None

    def loaded(self, judge: Judge) -> None:
        self.batcher = Batcher(judge, self.spec.max_batch_size, self.metrics)
        self.batcher.start()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20, middlewares=[middleware()])
        app[app_key()] = self.auth
        app.add_routes([web.get("/healthz", self.healthz), web.get("/readyz", self.readyz),
                        web.get("/metrics", self.prometheus), web.post("/score", self.score)])
        return app

    def not_ready_reason(self) -> Optional[str]:
        if self.start_error:
            return f"the judge's model failed to load: {self.start_error}"
        return None if self.batcher else f"loading {self.spec.model} ({self.spec.engine})"

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "failed" if self.start_error else "ok", "error": self.start_error},
                                 status=500 if self.start_error else 200)

    async def readyz(self, request: web.Request) -> web.Response:
        reason = self.not_ready_reason()
        return web.json_response({"ready": reason is None, "reason": reason, "judge": self.spec.name},
                                 status=503 if reason else 200)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics["_registry"]),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _error(self, status: int, message: str, result: str) -> web.Response:
        self.metrics["grpojob_judge_requests_total"].labels(result=result).inc()
        return web.json_response({"error": message, "judge": self.spec.name, "replica": self.replica}, status=status)

    async def score(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        try:
            body = ScoreIn.model_validate(await request.json())
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            return self._error(400, f"{where}: {err['msg']}", "refused")
        except ValueError as e:
            return self._error(400, f"the body is not JSON: {e}", "refused")
        reason = self.not_ready_reason()
        if reason or self.batcher is None:
            return self._error(503, reason or "not ready", "failed")
        judge = self.batcher.judge
        try:  # a generative judge's chat is tokenized to fit maxLength: off the HTTP loop
            texts = await asyncio.to_thread(lambda: [judge.render(i.prompt, i.completion) for i in body.items])
            scores = await self.batcher.score(texts)
        except Exception as e:  # noqa: BLE001 - the model's error, to the caller
            return self._error(500, f"{type(e).__name__}: {e}", "failed")
        if unparsed := sum(s is None for s in scores):
            self.metrics["grpojob_judge_unparsed_total"].inc(unparsed)
        self.metrics["grpojob_judge_requests_total"].labels(result="ok").inc()
        self.metrics["grpojob_judge_request_seconds"].observe(time.perf_counter() - start)
        return web.json_response({"scores": scores})
