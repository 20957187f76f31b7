"""The operator's side of the trainer leader endpoint: GET /status and POST /suspend, each with the
job's token (its Secret; grpojob.auth) as a bearer token."""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

import aiohttp
from pydantic import ValidationError

from grpojob.api import TrainerStatus

from . import names as n

log = logging.getLogger("grpojob.operator.trainer")


class TrainerClient:
    """One HTTP session for every job's trainer; each call has a short timeout so a hung trainer
    never stalls a reconcile."""

    def __init__(self, url_template: str = n.TRAINER_URL, timeout: float = 3.0):
        self.url_template = url_template
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: Optional[aiohttp.ClientSession] = None

    def base_url(self, name: str, namespace: str, port: int) -> str:
        return self.url_template.format(name=name, namespace=namespace, port=port).rstrip("/")

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def status(self, name: str, namespace: str, port: int, token: str) -> tuple[Optional[TrainerStatus], str]:
        """(status, "") or (None, why it could not be read)."""
        url = self.base_url(name, namespace, port) + "/status"
        try:
            async with self._http().get(url, headers=_bearer(token)) as resp:
                if resp.status == 401:
                    return None, f"GET {url}: HTTP 401: the trainer refused the token in Secret {n.token_name(name)}"
                if resp.status != 200:
                    return None, f"GET {url}: HTTP {resp.status}"
                body = await resp.json(content_type=None)
            return TrainerStatus.model_validate(body), ""
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return None, f"GET {url}: {type(e).__name__}: {e}"
        except (ValueError, ValidationError) as e:
            return None, f"GET {url}: not a TrainerStatus: {e}"

    async def suspend(self, name: str, namespace: str, port: int, token: str) -> str:
        """Ask the leader to checkpoint and stop; returns "" or why the request failed."""
        url = self.base_url(name, namespace, port) + "/suspend"
        try:
            async with self._http().post(url, headers=_bearer(token)) as resp:
                if resp.status >= 300:
                    return f"POST {url}: HTTP {resp.status}"
            return ""
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return f"POST {url}: {type(e).__name__}: {e}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
