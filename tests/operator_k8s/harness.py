"""Test harness: the real operator (kopf + kubernetes client) in its own thread and event loop,
talking HTTP to the kmock emulator, and a stand-in for trainer leader pods."""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Callable, Optional

import kopf
from aiohttp import web

from grpojob.api import TrainerStatus
from grpojob.auth import BODY, Auth
from grpojob_operator.config import OperatorConfig
from grpojob_operator.controller import Controller
from grpojob_operator.handlers import register

log = logging.getLogger("tests.harness")


class TrainerStub:
    """Mock of the trainer leader's HTTP endpoint (GET /status, POST /suspend), because no trainer
    pods run here: one aiohttp server on 127.0.0.1 answers for every job under /{namespace}/{name}.
    A job without a state set answers 503, like a trainer that is not up yet. Like the real one it
    answers only requests that carry the job's token (401 "unauthorized" otherwise), with the real
    check (grpojob.auth): the one in the job's Secret (`token_of(namespace, name)` reads it), kept
    once read, as a running pod keeps the file it mounted."""

    def __init__(self, token_of: Optional[Callable[[str, str], Optional[str]]] = None) -> None:
        self.token_of = token_of
        self._held: dict[tuple[str, str], str] = {}
        self.refused: list[tuple[str, str, str]] = []  # (ns, name, path) of requests without the token
        self.states: dict[tuple[str, str], TrainerStatus] = {}
        self.suspends: list[tuple[str, str]] = []
        self.on_suspend: Optional[Any] = None  # called with (ns, name) after a POST /suspend
        self.unreachable: set[tuple[str, str]] = set()  # jobs whose trainer answers nothing (503)
        self._runner: Optional[web.AppRunner] = None
        self.port = 0

    def set(self, ns: str, name: str, **fields: Any) -> TrainerStatus:
        old = self.states.get((ns, name), TrainerStatus())
        self.states[(ns, name)] = new = TrainerStatus.model_validate({**old.dump(), **fields})
        return new

    @property
    def url_template(self) -> str:
        return f"http://127.0.0.1:{self.port}/{{namespace}}/{{name}}"

    def _unauthorized(self, request: web.Request) -> Optional[web.Response]:
        key = (request.match_info["ns"], request.match_info["name"])
        token = self._held.get(key) or (self.token_of(*key) if self.token_of else None)
        if token is not None:
            self._held[key] = token
        if token is not None and Auth(token).accepts(request.headers.get("Authorization")):
            return None
        self.refused.append((*key, request.path.rsplit("/", 1)[1]))
        return web.Response(status=401, body=BODY)

    async def _status(self, request: web.Request) -> web.Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        key = (request.match_info["ns"], request.match_info["name"])
        st = None if key in self.unreachable else self.states.get(key)
        if st is None:
            return web.json_response({"error": "not up"}, status=503)
        return web.json_response(st.dump())

    async def _suspend(self, request: web.Request) -> web.Response:
        if (refused := self._unauthorized(request)) is not None:
            return refused
        key = (request.match_info["ns"], request.match_info["name"])
        self.suspends.append(key)
        if key in self.unreachable:
            return web.json_response({"error": "unreachable"}, status=503)
        if key in self.states:
            self.set(*key, phase="checkpointing")
        if self.on_suspend:
            self.on_suspend(*key)
        return web.json_response({"accepted": True}, status=202)

    async def __aenter__(self) -> "TrainerStub":
        app = web.Application()
        app.router.add_get("/{ns}/{name}/status", self._status)
        app.router.add_post("/{ns}/{name}/suspend", self._suspend)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner:
            await self._runner.cleanup()


class OperatorThread:
    """`grpojob operator` as the tests run it: a fresh registry and Controller, kopf.operator in a
    thread with its own loop (kopf cancels every task of its loop when it stops, so it must not
    share the test's loop with the emulator)."""

    def __init__(self, cfg: OperatorConfig, namespaces: tuple[str, ...] = ()):
        self.cfg = cfg
        self.namespaces = namespaces  # empty: all namespaces
        self.controller: Optional[Controller] = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def _main(self) -> None:
        registry = kopf.OperatorRegistry()
        self.controller = Controller(self.cfg)
        register(registry, self.controller)
        settings = kopf.OperatorSettings()
        settings.watching.reconnect_backoff = 0.1
        settings.networking.error_backoffs = [0.1, 0.2, 0.5]
        # Idle per-object workers otherwise linger 5 s, and kopf waits for them when it stops.
        settings.batching.idle_timeout = 0.3
        settings.posting.idle_timeout = 0.3

        async def run() -> None:
            self.loop = asyncio.get_running_loop()
            await kopf.operator(registry=registry, settings=settings, clusterwide=not self.namespaces,
                                namespaces=list(self.namespaces), standalone=True,
                                stop_flag=self._stop, ready_flag=self._ready)
        try:
            asyncio.run(run())
        except BaseException as e:  # reported by stop()
            self.error = e
            log.exception("operator thread failed")

    async def start(self) -> "OperatorThread":
        self._thread = threading.Thread(target=self._main, name="operator", daemon=True)
        self._thread.start()
        ok = await asyncio.to_thread(self._ready.wait, 30)
        assert ok and self.error is None, f"operator did not start: {self.error!r}"
        await self.wait_metrics_port()
        return self

    async def wait_metrics_port(self) -> None:
        for _ in range(200):
            if self.controller is not None and (self.cfg.metrics_port is None or self.controller.metrics.port):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("operator metrics server did not start")

    async def stop(self) -> None:
        """Graceful stop, as on SIGTERM. (kopf may wait up to 5 s for a timer it spawned while it
        was already stopping; cancelling instead can leave its watchers waiting forever.)"""
        self._stop.set()
        if self._thread is None:
            return
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), "operator did not stop within 30s"
