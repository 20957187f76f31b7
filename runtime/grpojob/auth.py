"""The job's token: where its processes find it, how a request proves it, what a refusal is.

One random token per job. On a cluster the operator keeps it in a Secret (`<job>-token`, key
`token`) mounted read-only into the job's pods; `grpojob run` keeps it in `<run dir>/token`
(mode 0600). Every process finds the file through GRPOJOB_TOKEN_FILE (grpojob.plan sets it for
every role). The token itself is never in an environment variable, a command line, the runtime
config, a status, an Event or a log line.

A request proves it with `Authorization: Bearer <token>` (OpenAI clients send their API key so,
so OPENAI_API_KEY=<token> works); on the trainer leader also with `X-API-Key: tml-<token>`, Tinker's
API key (the tinker SDK with api_key="tml-" + token). A request without it or with another token gets 401 with the
body "unauthorized" and nothing else; the refusal is logged with the caller's address, never the
token. /healthz and /readyz stay open for the kubelet; /metrics is open unless
GRPOJOB_METRICS_AUTH is true (the operator's chart value `jobs.metricsAuth`). Every other path is
protected by default, so a new endpoint cannot be left open by forgetting it.

The two server styles the runtime has each get one call that authorizes a request:
`authorize_aiohttp(request)` (aiohttp: the rollout servers; it finds the Auth in the app under
`app_key()`) and `authorize_handler(handler)` (http.server: the trainer leader; the handler class
carries `auth`). Both return whether the request may go on and answer the 401 themselves.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

log = logging.getLogger("grpojob.auth")

ENV_TOKEN_FILE = "GRPOJOB_TOKEN_FILE"
ENV_METRICS_AUTH = "GRPOJOB_METRICS_AUTH"  # "true": /metrics needs the token too
TOKEN_KEY = "token"  # the key inside the job's Secret, and the file's name in a local run dir
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # kubelet probes
METRICS_PATH = "/metrics"
BODY = b"unauthorized"
TOKEN_BYTES = 32  # 256 bits
TINKER_KEY_PREFIX = "tml-"  # the token as the tinker SDK's api_key (X-API-Key), on the trainer leader


class TokenError(RuntimeError):
    """The token cannot be read; the message says where it was looked for."""


def generate() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def ensure_file(path: Path) -> Path:
    """The token file of a local run: created with a fresh token (mode 0600) when absent, else
    kept (a resumed run keeps its token) with its mode tightened to 0600."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            path.chmod(0o600)
            log.warning("token file %s was readable by others (mode %o): now 0600", path, mode)
        read_file(path)  # an existing file must hold a token
        return path
    with os.fdopen(fd, "w") as f:
        f.write(generate() + "\n")
    return path


def read_file(path: Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise TokenError(f"cannot read the job's token from {path} ({ENV_TOKEN_FILE}): {e.strerror}") from None
    if not token:
        raise TokenError(f"the job's token file {path} ({ENV_TOKEN_FILE}) is empty")
    return token


def _true(value: Optional[str]) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Auth:
    """The job's token as a process holds it (its repr never shows the token)."""
    token: str = field(repr=False)
    metrics: bool = False  # /metrics requires the token

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Auth":
        path = environ.get(ENV_TOKEN_FILE)
        if not path:
            raise TokenError(f"{ENV_TOKEN_FILE} is not set: it names the file holding the job's token "
                             f"(the operator mounts the job's Secret; grpojob run writes <run dir>/token)")
        return cls(read_file(Path(path)), metrics=_true(environ.get(ENV_METRICS_AUTH)))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def accepts(self, authorization: Optional[str]) -> bool:
        """Whether an Authorization header carries this token (constant-time comparison)."""
        scheme, _, value = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode(), self.token.encode())

    def accepts_api_key(self, api_key: Optional[str]) -> bool:
        """Whether an X-API-Key header carries this token as a Tinker API key: `tml-<token>` (the
        `tinker` SDK takes no key without that prefix; constant-time comparison)."""
        key = (api_key or "").strip()
        if not key.startswith(TINKER_KEY_PREFIX):
            return False
        return hmac.compare_digest(key[len(TINKER_KEY_PREFIX):].encode(), self.token.encode())

    def protects(self, path: str) -> bool:
        return path not in OPEN_PATHS and (path != METRICS_PATH or self.metrics)

    def mac(self, *parts: str) -> str:
        """HMAC-SHA256 of the parts under the token: proofs and names derived from it."""
        msg = "\0".join(parts).encode()
        return hmac.new(self.token.encode(), msg, hashlib.sha256).hexdigest()

    def verify_mac(self, mac: Any, *parts: str) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(mac.encode(), self.mac(*parts).encode())


# ---- refusals -------------------------------------------------------------------------------------
class _RefusalLog:
    """One log line per caller address per `every` seconds: a scanner cannot flood the logs."""

    def __init__(self, every: float = 10.0):
        self.every = every
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, peer: str, method: str, path: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, hidden = self._last.get(peer, (-self.every, 0))
            if now - last < self.every:
                self._last[peer] = (last, hidden + 1)
                return
            self._last[peer] = (now, 0)
            if len(self._last) > 4096:  # forget the oldest callers
                for k in sorted(self._last, key=lambda k: self._last[k][0])[:2048]:
                    del self._last[k]
        more = f" (and {hidden} more refusals from it since the last line)" if hidden else ""
        log.warning("refused %s %s from %s: %s%s", method, path, peer, why, more,
                    extra={"peer": peer, "path": path})


refused = _RefusalLog()


def _why(authorization: Optional[str]) -> str:
    if not authorization:
        return "no token"
    return "wrong token" if authorization.strip().lower().startswith("bearer ") else "not a bearer token"


# ---- aiohttp (rollout servers) ------------------------------------------------------------------
_APP_KEY: Any = None


def app_key() -> Any:
    """The aiohttp AppKey under which a server keeps its Auth."""
    global _APP_KEY
    if _APP_KEY is None:
        from aiohttp import web
        _APP_KEY = web.AppKey("grpojob_auth", Auth)
    return _APP_KEY


def unauthorized_aiohttp() -> Any:
    from aiohttp import web
    return web.Response(status=401, body=BODY, content_type="text/plain",
                        headers={"WWW-Authenticate": "Bearer"})


def authorize_aiohttp(request: Any) -> bool:
    """True when the request carries the app's token; else False, and the caller answers
    `unauthorized_aiohttp()` (the refusal is logged here)."""
    header = request.headers.get("Authorization")
    if request.app[app_key()].accepts(header):
        return True
    refused(request.remote or "?", request.method, request.path, _why(header))
    return False


def middleware() -> Any:
    """aiohttp middleware: every path the app's Auth protects needs the token."""
    from aiohttp import web

    @web.middleware
    async def check(request: Any, handler: Any) -> Any:
        if request.app[app_key()].protects(request.path) and not authorize_aiohttp(request):
            return unauthorized_aiohttp()
        return await handler(request)
    return check


# ---- http.server (trainer leader) ---------------------------------------------------------------
def authorize_handler(handler: Any) -> bool:
    """For a BaseHTTPRequestHandler whose class carries `auth`: True when the request carries the
    token; else the 401 is sent (and logged) here and the caller returns."""
    header = handler.headers.get("Authorization")
    if handler.auth.accepts(header) or handler.auth.accepts_api_key(handler.headers.get("X-API-Key")):
        return True
    path = handler.path.split("?")[0]
    refused(handler.client_address[0] if handler.client_address else "?", handler.command, path, _why(header))
    handler.send_response(401)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("WWW-Authenticate", "Bearer")
    handler.send_header("Content-Length", str(len(BODY)))
    handler.end_headers()
    handler.wfile.write(BODY)
    return False
