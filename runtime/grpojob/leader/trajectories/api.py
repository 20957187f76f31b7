"""The trajectory API's HTTP handlers, served by the trainer leader (rank 0) on its HTTP port under
grpojob.plan.TRAJECTORY_PREFIX (environments find the URL in GRPOJOB_TRAJECTORY_URL):

    POST /trajectories/register  {"name", "groups_per_step"?, "replica"?}
        -> 200 {"name", "groups_per_step", "group_size", "sampling": {...}, "published_version", ...}
    POST /trajectories/groups    {"environment", "groups": [GroupIn, ...]}  (wire.py)
        -> 200 {"accepted": n, "queued": n, "published_version", "version_floor"}
    GET  /trajectories/status    -> versions, the floor, per-environment queued / accepted / trained /
                                    stale / refused (by reason), what the current step waits for; sessions
    GET  /trajectories/sessions/{id}          -> an agent session's record (the rollout servers read it)
    POST /trajectories/sessions/{id}/turns    <- a turn the rollout server served (wire.SessionTurnIn)
    POST /trajectories/sessions/{id}/reward   {"reward"?, "reward_parts"?, "row"?} -> ends the session
                                              (sessions.py; the rollout servers pass /v1/sessions/{id}/reward on)
    /trajectories/atropos/<token>/...         Atropos's run-api, the environment side (atropos.py)

Refusals: 400 (the body, naming the field: wrong group size, token ids outside the vocabulary,
mismatched lengths, a version from the future), 404 (not registered), 409 (below the version
floor: stale; or commitments beyond promptsPerStep), 429 (queue full), 503 (the trainer is still
loading or resuming). A submission is taken whole or not at all.

Why the leader's port and not one of its own: environments, the operator and Prometheus reach one
address per job (the headless Service's `http` port, GRPOJOB_TRAINER_PORT locally), and the
job's bearer token (issue 15) guards one server. Bodies are small (token ids and floats of one
batch) and validation runs in the server's request thread, off the training loop.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from pydantic import ValidationError

from grpojob.plan import TRAJECTORY_PREFIX
from grpojob.leader.trajectories import wire
from grpojob.leader.trajectories.atropos import ATROPOS_PREFIX
from grpojob.leader.trajectories.queue import Refused
from grpojob.leader.trajectories.sessions import Sessions

log = logging.getLogger("grpojob.leader.trajectories")
SESSIONS = "/sessions"

Response = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


class Manager(Protocol):
    """What the API needs of the RolloutManager."""

    def register(self, name: str, groups_per_step: Optional[int]) -> dict[str, Any]: ...

    def submit(self, name: str, groups: list) -> int: ...

    def count_refused(self, name: Optional[str], reason: str, n: int) -> None: ...

    def environment_status(self) -> dict[str, Any]: ...


class TrajectoryAPI:
    """Routes one request (already read off the socket) to the manager; returns (status, JSON)."""

    def __init__(self, manager: Manager, limits: wire.Limits, sampling: dict[str, Any],
                 policy_version=lambda: None, sessions: Optional[Sessions] = None):
        self.manager, self.limits, self.sampling = manager, limits, sampling
        self.policy_version = policy_version  # the trainer's own version (its StatusBoard)
        self.sessions = sessions  # agent sessions (grpojob.leader.trajectories.sessions)
        self.atropos = None  # Atropos's run-api routes (atropos.AtroposAPI), when built with a version lookup

    def handle(self, request: Request) -> Response:
        route = request.path.split("?")[0].removeprefix(TRAJECTORY_PREFIX)
        try:
            if (request.method, route) == ("POST", "/register"):
                return self.register(request.body)
            if (request.method, route) == ("POST", "/groups"):
                return self.submit(request.body)
            if (request.method, route) == ("GET", "/status"):
                return 200, self.status()
            if route.startswith(ATROPOS_PREFIX + "/") and self.atropos is not None:
                # /atropos/<token>/<route>: the leader checked the token (the path's, Atropos sends no header)
                rest = route[len(ATROPOS_PREFIX) + 1:].partition("/")[2]
                return self.atropos.handle(request.method, "/" + rest, request.headers, request.body)
            if route.startswith(SESSIONS + "/") and self.sessions is not None:
                return self.session(request.method, route[len(SESSIONS) + 1:], request.body)
        except Refused as e:
            return e.status, {"error": str(e), "reason": e.reason}
        return 404, {"error": f"no route {request.method} {request.path}: use POST {TRAJECTORY_PREFIX}/register, "
                              f"POST {TRAJECTORY_PREFIX}/groups or GET {TRAJECTORY_PREFIX}/status"}

    def register(self, body: bytes) -> Response:
        try:
            req = wire.RegisterIn.model_validate_json(body)
        except ValidationError as e:
            return 400, {"error": wire.describe(e), "reason": "invalid"}
        out = self.manager.register(req.name, req.groups_per_step)
        log.info("environment %s registered%s", req.name, f" from {req.replica}" if req.replica else "")
        return 200, {**out, "group_size": self.limits.group_size, "sampling": self.sampling,
                     "max_sequence_tokens": self.limits.max_sequence_tokens}

    def submit(self, body: bytes) -> Response:
        try:
            req = wire.SubmitIn.model_validate_json(body, context=self.limits)
        except ValidationError as e:
            name, n = _who(body)
            self.manager.count_refused(name, "invalid", n)
            return 400, {"error": wire.describe(e), "reason": "invalid"}
        accepted = self.manager.submit(req.environment, [g.to_group(req.environment) for g in req.groups])
        status = self.manager.environment_status()
        return 200, {"accepted": accepted, "queued": status["queued"], "published_version": status["published_version"],
                     "version_floor": status["version_floor"]}

    def status(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version(), "group_size": self.limits.group_size,
                **self.manager.environment_status(),
                **({"sessions": self.sessions.status()} if self.sessions is not None else {})}

    def session(self, method: str, rest: str, body: bytes) -> Response:
        sid, _, action = rest.partition("/")
        if not sid:
            return 404, {"error": "no session id in the path"}
        if (method, action) == ("GET", ""):
            state = self.sessions.state(sid)
            return (200, state) if state is not None else (404, {"error": f"session {sid} is not open",
                                                                 "reason": "unknown"})
        model = {("POST", "turns"): wire.SessionTurnIn, ("POST", "reward"): wire.SessionRewardIn}.get((method, action))
        if model is None:
            return 404, {"error": f"no route {method} {SESSIONS}/{rest}: use GET {SESSIONS}/ID, POST "
                                  f"{SESSIONS}/ID/turns or POST {SESSIONS}/ID/reward"}
        try:
            req = model.model_validate_json(body or b"{}", context=self.limits)
        except ValidationError as e:
            return 400, {"error": wire.describe(e), "reason": "invalid"}
        if action == "turns":
            return 200, self.sessions.add_turn(sid, req)
        return 200, self.sessions.finish(sid, req)


def _who(body: bytes) -> tuple[Optional[str], int]:
    """The environment and group count of a body that failed validation, as far as they can be read."""
    try:
        doc = json.loads(body)
        groups = doc.get("groups")
        return (doc.get("environment") if isinstance(doc.get("environment"), str) else None,
                max(1, len(groups)) if isinstance(groups, list) else 1)
    except (ValueError, AttributeError):
        return None, 1
