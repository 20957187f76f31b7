"""The trainer's side of spec.judges: score a group's completions at a judge server.

One request per group (the group's completions together; the server batches concurrent groups into
forward passes), spread over the judge's replicas in turn. A request that times out or finds the
judge unavailable (connection refused, 5xx, not ready) is retried `retries` times with exponential
back-off, on the next replica; then the judge's onFailure decides (JudgeUnavailable carries it). A
request the judge refuses (4xx) fails at once: retrying cannot help. A null score (a generative
judge's answer its parser could not read) leaves the group unscored: onFailure decides at once,
without retries (a greedy judge answers the same again), and no guessed reward stands in for it.
Before its first request the client waits up to startupTimeoutSeconds for a replica's /readyz (the
judge loads its model while the trainer starts).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Optional

import aiohttp

from grpojob.api.judge import JudgeSpec
from grpojob.auth import Auth
from grpojob.plan import ENV_JUDGE_URLS
from grpojob.rewards.judge_watch import JudgeWatch

log = logging.getLogger("grpojob.rewards.judges")
BACKOFF_SECONDS = 0.5


class JudgeError(RuntimeError):
    pass


class JudgeRefused(JudgeError):
    """The judge answered 4xx: the request itself is wrong (a retry cannot help)."""


class JudgeUnavailable(JudgeError):
    """The judge could not score after every retry; spec.judges[i].onFailure decides."""


class GroupSkipped(JudgeUnavailable):
    """onFailure skip: the group is dropped and its prompt generated again (the rollout manager)."""


class JudgeDown(JudgeUnavailable):
    """The judge has scored nothing for its startupTimeoutSeconds (judge_watch): the step fails, even
    with onFailure skip (which must not skip for ever), as with fail."""


def urls_from_env(environ=os.environ) -> dict[str, list[str]]:
    text = environ.get(ENV_JUDGE_URLS)
    return json.loads(text) if text else {}


class JudgeClient:
    def __init__(self, spec: JudgeSpec, urls: list[str], token: str, where: str = "spec.judges"):
        """where: the judge's place in the spec (spec.judges[i]), for its errors."""
        if not urls:
            raise JudgeError(f"judge '{spec.name}': no address ({ENV_JUDGE_URLS} names none)")
        self.spec, self.urls, self.token = spec, [u.rstrip("/") for u in urls], token
        self.watch = JudgeWatch(spec, where)  # its metrics, and whether it is down
        self._next = 0
        self._session: Optional[aiohttp.ClientSession] = None
        self._ready = False
        self._ready_lock: Optional[asyncio.Lock] = None
        # what the trainer's metrics read: the last request's latency and the requests in flight
        self.in_flight = 0
        self.last_seconds: Optional[float] = None
        self.failures = 0
        self.unparsed = 0  # answers of a generative judge its parser could not read

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=Auth(self.token).headers())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def wait_ready(self) -> None:
        if self._ready:
            return
        self._ready_lock = self._ready_lock or asyncio.Lock()
        async with self._ready_lock:
            deadline, why = time.monotonic() + self.spec.startup_timeout_seconds, "no answer"
            while not self._ready:
                for url in self.urls:
                    try:
                        async with self._client().get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=5)) as r:
                            if r.status == 200:
                                self._ready = True
                                break
                            why = (await r.json()).get("reason") or f"HTTP {r.status}"
                    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if self._ready:
                    break
                if time.monotonic() > deadline:
                    self.watch.failed("not_ready")
                    raise (JudgeDown if self.spec.on_failure == "skip" else JudgeUnavailable)(
                        f"judge '{self.spec.name}' ({self.watch.where}) not ready after "
                        f"{self.spec.startup_timeout_seconds:.0f} s at {self.urls}: {why}")
                await asyncio.sleep(0.5)

    async def score(self, prompt: str, completions: list[str]) -> list[float]:
        """One score per completion; JudgeRefused, or JudgeUnavailable after the retries."""
        started = time.monotonic()
        await self.wait_ready()
        body = {"items": [{"prompt": prompt, "completion": c} for c in completions]}
        last = ""
        for attempt in range(self.spec.retries + 1):
            if attempt:
                await asyncio.sleep(BACKOFF_SECONDS * 2 ** (attempt - 1))
            url = self.urls[self._next % len(self.urls)]
            self._next += 1
            start, self.in_flight = time.perf_counter(), self.in_flight + 1
            self.watch.sent()
            try:
                async with self._client().post(f"{url}/score", json=body,
                                               timeout=aiohttp.ClientTimeout(total=self.spec.timeout_seconds)) as r:
                    if 400 <= r.status < 500:
                        self.watch.failed("refused")
                        raise JudgeRefused(f"judge '{self.spec.name}' refused the request ({r.status}): "
                                           f"{(await r.text())[:300]}")
                    if r.status != 200:
                        self.watch.failed("server_error")
                        last = f"HTTP {r.status}: {(await r.text())[:300]}"
                        continue
                    scores = (await r.json())["scores"]
                    self.last_seconds = time.perf_counter() - start
                    self.watch.answered(self.last_seconds)
                    if len(scores) != len(completions):
                        self.watch.failed("bad_answer")
                        raise JudgeRefused(f"judge '{self.spec.name}' returned {len(scores)} scores for "
                                           f"{len(completions)} completions")
                    unread = [j for j, s in enumerate(scores) if s is None]
                    if unread:
                        self.watch.failed("unparsed")
                        self.failures += 1
                        self.unparsed += len(unread)
                        raise self._unscored(f"judge '{self.spec.name}' could not read a score in {len(unread)} "
                                             f"of {len(scores)} answers (completions {unread[:8]}; its log "
                                             "shows them)", started)
                    self.watch.scored()
                    return [float(s) for s in scores]
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                self.watch.failed("timeout" if isinstance(e, asyncio.TimeoutError) else "connection")
                last = f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} after {self.spec.timeout_seconds} s"
            finally:
                self.in_flight -= 1
                self.watch.done()
            log.warning("judge '%s' at %s: %s (attempt %d of %d)", self.spec.name, url, last, attempt + 1,
                        self.spec.retries + 1)
        self.failures += 1
        raise self._unscored(f"judge '{self.spec.name}' could not score after {self.spec.retries + 1} attempts: "
                             f"{last}", started)

    def _unscored(self, message: str, started: float) -> JudgeUnavailable:
        """The error of a group left unscored (started: when its scoring began), as onFailure says;
        with skip, JudgeDown once the judge has scored nothing for its startupTimeoutSeconds."""
        down = self.watch.unscored(started)
        if down and self.spec.on_failure == "skip":
            return JudgeDown(f"{down}; the last group: {message}")
        return (GroupSkipped if self.spec.on_failure == "skip" else JudgeUnavailable)(message)
