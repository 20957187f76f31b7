"""The rollout server's side of turn-taking (spec.placement colocated): the trainer puts the engine
to sleep before it trains and wakes it to generate (grpojob.leader.turns is the caller).

HTTP (the job's token, as every endpoint but the probes):
- POST /sleep {"level": 1} -> {"asleep": true, "seconds", "decode_steps", "freed_bytes", ...: the
  engine's numbers, "host_peak_bytes": this process's peak resident memory since the last mark
  (the generate phase)}. Returns once the engine is asleep; /generate requests that come meanwhile
  wait for the wake.
- POST /wake_up -> {"asleep": false, ..., "host_peak_bytes": the peak while asleep (the train phase)}.
- POST /memory {"phase": "sync"} -> {"host_peak_bytes": the peak since the last mark}.
409 when the engine has no sleep mode, 503 while it loads or once it broke.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

import torch
from aiohttp import web

from grpojob.memory import StageMemory
from grpojob.rollout import engine as engines

log = logging.getLogger("grpojob.rollout")


class Turns:
    def __init__(self, server):
        self.server = server
        self.memory = StageMemory(torch.device("cpu"))  # this process's host peak per phase

    def routes(self) -> list:
        return [web.post("/sleep", self.sleep), web.post("/wake_up", self.wake),
                web.post("/memory", self.mark)]

    def _refuse(self) -> Optional[web.Response]:
        if (resp := self.server._unavailable()) is not None:
            return resp
        if not engines.sleeps(type(self.server.engine)):
            return web.json_response({"error": f"the {self.server.engine.backend} engine has no sleep mode",
                                      "replica": self.server.replica}, status=409)
        return None

    def _peak(self, phase: str) -> Optional[int]:
        self.memory.mark(phase)
        host, _ = self.memory.take()
        return host.get(phase)

    async def _body(self, request: web.Request) -> dict:
        try:
            doc = await request.json() if request.can_read_body else {}
        except ValueError:
            raise web.HTTPBadRequest(text="the request body is not JSON") from None
        if not isinstance(doc, dict):
            raise web.HTTPBadRequest(text="the request body must be a JSON object")
        return doc

    async def sleep(self, request: web.Request) -> web.Response:
        if (resp := self._refuse()) is not None:
            return resp
        level = (await self._body(request)).get("level", 1)
        try:
            result = await self.server.engine.sleep(int(level))
        except ValueError as e:
            return web.json_response({"error": str(e), "replica": self.server.replica}, status=400)
        log.info("engine asleep", extra={"turn": "sleep", "at": time.time(), **_numbers(result)})
        return web.json_response({"replica": self.server.replica, "asleep": True, **result,
                                  "host_peak_bytes": self._peak("generate")})

    async def wake(self, request: web.Request) -> web.Response:
        if (resp := self._refuse()) is not None:
            return resp
        result = await self.server.engine.wake()
        log.info("engine awake", extra={"turn": "wake", "at": time.time(), **_numbers(result)})
        return web.json_response({"replica": self.server.replica, "asleep": False, **result,
                                  "host_peak_bytes": self._peak("train")})

    async def mark(self, request: web.Request) -> web.Response:
        phase = str((await self._body(request)).get("phase", "sync"))
        return web.json_response({"replica": self.server.replica, "host_peak_bytes": self._peak(phase)})


def _numbers(result: dict) -> dict:
    return {k: v for k, v in result.items() if isinstance(v, (int, float))}
