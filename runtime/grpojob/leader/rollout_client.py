"""RolloutClient: the trainer side of the rollout servers' HTTP API (a `Generator`).

    client = RolloutClient(publisher.rollout_addresses, token=auth.token)   # or a fixed list of base URLs
    completions = await client.generate(prompt_ids, n, sampling, min_version=v)

- Least-loaded: each request goes to the server with the fewest completions this client has in
  flight there (ties: the one that served fewer requests). The address list is re-read for every
  request, so servers that join or leave are picked up at once.
- Retries: a connection error, a timeout or a 5xx puts the server on a short cool-down and the
  request goes to another server (a 503 `draining`, from a server that is stopping and finishes
  only what it has, is no failure: it is not logged nor named by `health()`); a 409 (the server holds a policy older than `min_version`,
  e.g. it is still receiving the push) tries another server, then waits for one to catch up.
  A 400 is the request's own fault and raises at once; so does a 401 (the server does not hold
  this job's token: every request carries it as a bearer token, grpojob.auth).
- A server that leaves the list while a request is in flight there (the trainer dropped it: it
  died or hangs, e.g. stopped heartbeating) has that request abandoned within a second and sent
  to another server, rather than waited for until `request_timeout`. A server that left on its
  own (stopping, scaled down: `draining`) is waited for instead: it answers what it has.
- Timeouts: `request_timeout` per HTTP request, `timeout` for the whole call (then RolloutError
  with the last error of every server tried); with no server registered it waits up to
  `timeout` for one.
- Health: a server that starts failing (or fails differently) is logged once, with its error (a
  broken engine answers 503 with the engine's error), and once more when it answers again;
  `health()` says in words which servers fail and why, for the trainer's logs and /status.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable, Optional, Sequence, Union

import aiohttp

from grpojob.contracts.rollout import Completion, SamplingParams

log = logging.getLogger("grpojob.leader.rollout_client")
LEFT_CHECK_SECONDS = 1.0  # how often a request in flight checks that its server is still listed


async def _body(r: aiohttp.ClientResponse):
    """The JSON answer; a body that is not JSON (a proxy's or a crashed handler's page) as its
    text, so that its status and words reach the log instead of a decoding error."""
    text = await r.text(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        if r.status == 200:
            raise
        return {"error": " ".join(text.split())[:300] or f"HTTP {r.status} with an empty body"}


class RolloutError(RuntimeError):
    """Generation could not be done; the message says which servers were tried and why."""


class ServerLeft(Exception):
    """The server a request was in flight on left the server list."""


class RolloutClient:
    def __init__(self, addresses: Union[Callable[[], Sequence[str]], Sequence[str]], *, token: str,
                 request_timeout: float = 600.0, timeout: float = 1800.0, cooldown: float = 5.0,
                 poll_seconds: float = 0.25, draining: Optional[Callable[[], Sequence[str]]] = None):
        """`draining`: servers that left the list on their own and finish what they have (the
        publisher's draining_addresses): a request in flight there is waited for, not sent again."""
        self._addresses = addresses if callable(addresses) else (lambda a=tuple(addresses): a)
        self._draining = draining or (lambda: ())
        self.request_timeout = request_timeout
        self.timeout = timeout
        self.cooldown = cooldown
        self.poll_seconds = poll_seconds
        self._headers = {"Authorization": f"Bearer {token}"}
        self._inflight: dict[str, int] = {}
        self._served: dict[str, int] = {}
        self._cool_until: dict[str, float] = {}
        self._failing: dict[str, str] = {}  # server -> its last error, until it answers again
        self._session: Optional[aiohttp.ClientSession] = None
        self._session_loop: Optional[asyncio.AbstractEventLoop] = None

    def servers(self) -> list[str]:
        return [a.rstrip("/") for a in self._addresses()]

    def loads(self) -> dict[str, int]:
        """Completions in flight per server."""
        return {u: self._inflight.get(u, 0) for u in self.servers()}

    def _pick(self, tried: set[str]) -> Optional[str]:
        now = time.monotonic()
        fresh = [u for u in self.servers() if u not in tried]
        warm = [u for u in fresh if self._cool_until.get(u, 0) <= now]
        pool = warm or fresh
        if not pool:
            return None
        return min(pool, key=lambda u: (self._inflight.get(u, 0), self._served.get(u, 0)))

    async def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512), headers=self._headers)
            self._session_loop = loop  # a session belongs to one event loop
        return self._session

    async def generate(self, prompt_ids: list[int], n: int, sampling: SamplingParams, *,
                       min_version: Optional[int] = None) -> list[Completion]:
        session = await self._client()
        payload = {"prompt_ids": list(prompt_ids), "n": n, "min_version": min_version,
                   "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                "top_k": sampling.top_k, "max_tokens": sampling.max_tokens,
                                "seed": sampling.seed}}
        end = time.monotonic() + self.timeout
        tried: set[str] = set()
        errors: dict[str, str] = {}
        while True:
            left = end - time.monotonic()
            if left <= 0:
                detail = "; ".join(f"{u}: {e}" for u, e in errors.items()) or "no rollout server registered"
                raise RolloutError(f"no rollout server completed a generate request within "
                                   f"{self.timeout:.0f} s ({detail})")
            url = self._pick(tried)
            if url is None:  # every server tried (or none yet): wait a little, then go round again
                await asyncio.sleep(min(self.poll_seconds, left))
                tried.clear()
                continue
            tried.add(url)
            self._inflight[url] = self._inflight.get(url, 0) + n
            try:
                status, body = await self._post(session, url, payload, min(self.request_timeout, left))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, ServerLeft) as e:
                errors[url] = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                self._cool_until[url] = time.monotonic() + self.cooldown
                self._failed(url, errors[url])
                continue
            finally:
                self._inflight[url] -= n
            if status == 200:
                self._served[url] = self._served.get(url, 0) + 1
                if self._failing.pop(url, None) is not None:
                    log.info("rollout server %s answers again", url)
                return [Completion(prompt_ids=list(prompt_ids), **c) for c in body["completions"]]
            if status == 401:
                raise RolloutError(f"rollout server {url} refused this job's token (HTTP 401): it does not "
                                   f"hold the token in GRPOJOB_TOKEN_FILE")
            message = body.get("error") if isinstance(body, dict) else str(body)
            if status == 400:
                raise RolloutError(f"rollout server {url} rejected the request: {message}")
            errors[url] = f"HTTP {status}: {message}"
            if status == 503 and isinstance(body, dict) and body.get("draining"):  # leaving (scaled down):
                self._cool_until[url] = time.monotonic() + self.cooldown  # no failure, just elsewhere
                continue
            if status != 409:
                self._cool_until[url] = time.monotonic() + self.cooldown
                self._failed(url, errors[url])

    async def _post(self, session: aiohttp.ClientSession, url: str, payload: dict, seconds: float):
        """POST /generate: (status, body); ServerLeft as soon as `url` is no longer listed."""
        async def post():
            async with session.post(url + "/generate", json=payload, timeout=aiohttp.ClientTimeout(total=seconds)) as r:
                return r.status, (await _body(r) if r.status != 401 else None)

        request = asyncio.ensure_future(post())
        try:
            while True:
                done, _ = await asyncio.wait({request}, timeout=LEFT_CHECK_SECONDS)
                if done:
                    return request.result()
                # a server that left to stop (scaled down) answers what it has: sending it again
                # elsewhere made both generate it (on shared cores a step took 6 s instead of 0.5)
                if url not in self.servers() and url not in {u.rstrip("/") for u in self._draining()}:
                    raise ServerLeft("left the rollout servers (dropped by the trainer: dead or hung)")
        finally:
            if not request.done():
                request.cancel()

    def _failed(self, url: str, error: str) -> None:
        if self._failing.get(url) != error:  # once per server and error, not once per request
            log.warning("rollout server %s fails: %s (requests go to the other servers meanwhile)", url, error)
        self._failing[url] = error

    def health(self) -> Optional[str]:
        """Which rollout servers fail and why (None when every registered server answers). A server
        that left the list (the trainer dropped it) is still named until one answers again."""
        listed = self.servers()
        failing = "; ".join(f"{u}: {e}" for u, e in self._failing.items())
        if not listed:
            return "no rollout server is registered" + (f" (last errors: {failing})" if failing else "")
        if failing:
            return f"rollout servers failing: {failing}"
        return None

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None
