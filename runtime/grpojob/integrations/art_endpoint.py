"""The OpenAI endpoint an ART script's client talks to (grpojob.integrations.art): a small
forwarder on 127.0.0.1 in the script's own process, in front of the job's rollout servers.

Why a forwarder: ART's own backends serve vLLM with log-probs forced on for every chat request and
`--return-tokens-as-token-ids` (ART's `art_vllm_runtime` patches), so an ART rollout function never
asks for them; and ART builds the script's client itself from the (base_url, api_key) its backend
returns. The rollout servers give the same only when a request asks. So every request is passed on
with what ART's server would have done to it:

- `/v1/chat/completions`: `logprobs: true`, `return_tokens_as_token_ids: true` ("token_id:N"
  log-prob entries, as ART reads them) and `return_token_ids: true` (each choice's
  `prompt_token_ids`, `token_ids`, `policy_version`: the exact tokens the trainer trains on);
  `/v1/completions`: `logprobs` at least 1 and the same two;
- `temperature`, `top_p`, `top_k` set to the job's `rollout.sampling` (the trainer recomputes the
  log-probs at those; agent sessions do the same, docs/agents.md), unless `keep_sampling`;
- everything else (`/v1/models`, headers, streaming) unchanged. Requests go round-robin over
  `GRPOJOB_OPENAI_BASE_URLS`. The client's `Authorization` (the job's token, which the backend gave
  it as api_key) is passed on: the forwarder adds no credential of its own.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from typing import Any, Optional

__all__ = ["Forwarder"]

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


def rewrite(path: str, body: dict[str, Any], sampling: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The request as ART's own vLLM server would have taken it (see the module docstring)."""
    out = dict(body)
    if path.endswith("/chat/completions"):
        out["logprobs"] = True
    elif path.endswith("/completions"):
        out["logprobs"] = max(1, int(out.get("logprobs") or 0))
    else:
        return out
    out["return_tokens_as_token_ids"] = True
    out["return_token_ids"] = True
    for key in ("temperature", "top_p", "top_k"):
        if sampling and sampling.get(key) is not None:
            out[key] = sampling[key]
    return out


class Forwarder:
    """An aiohttp server on its own thread and event loop (the script's loop may block: a sync
    litellm call inside an async rollout must not stall the requests it waits for)."""

    def __init__(self, upstreams: list[str], sampling: Optional[dict[str, Any]] = None):
        if not upstreams:
            raise ValueError("no rollout server to forward to (GRPOJOB_OPENAI_BASE_URLS / OPENAI_BASE_URL)")
        self.upstreams = [u.rstrip("/") for u in upstreams]  # each ends in /v1
        self.sampling = sampling
        self._next = itertools.cycle(range(len(self.upstreams)))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpojob-art-endpoint", daemon=True)
        self._runner = None
        self._session = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "Forwarder":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def _forward(self, request):
        from aiohttp import web

        tail = request.match_info["tail"]
        raw = await request.read()
        if request.method == "POST" and raw:
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                raw = json.dumps(rewrite("/" + tail, doc, self.sampling)).encode()
        url = f"{self.upstreams[next(self._next)]}/{tail}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        try:
            upstream = await self._session.request(request.method, url, data=raw or None, headers=headers,
                                                   params=request.query)
        except OSError as e:  # aiohttp's connection errors are OSErrors
            return web.json_response({"error": {"message": f"rollout server {url} unreachable: {e}",
                                                "type": "unavailable"}}, status=503)
        async with upstream:
            out = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def stop():
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
