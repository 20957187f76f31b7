"""A grpojob backend for ART (openpipe-art 0.5): an ART training script changes one line,

    backend = LocalBackend()          # ->  backend = GRPOJobBackend()   (from grpojob.integrations.art)

and trains a GRPOJob. The script runs as one of the job's `spec.environments` (docs/plugins.md#art),
so everything it needs comes from the job's environment (docs/environments.md):

- `model.register(backend)` registers the script with the trainer's trajectory API
  (`GRPOJOB_TRAJECTORY_URL`, the job's token from `GRPOJOB_TOKEN_FILE`) under `GRPOJOB_ENVIRONMENT`,
  and gives ART an OpenAI endpoint (`model.openai_client()`, `model.inference_base_url`) that is a
  forwarder in this process in front of the rollout servers (art_endpoint: it asks for log-probs
  and the exact tokens on every request, as ART's own vLLM server does);
- `backend.train(model, groups, **settings)` checks ART's settings against the job's spec
  (art_settings: honoured where the job does what they ask, refused by name where it does not),
  turns each TrajectoryGroup into a group of exact tokens, log-probs, loss masks and versions
  (art_groups), posts them to `/trajectories/groups`, waits until the trainer has trained them and
  pushed the new weights to the rollout servers, and returns a TrainResult (the policy version as
  its `step`, the trainer's step record as metrics);
- `model.get_step()` is the trainer's policy version; `model.log(...)` is ART's own (local files).

A step of the job trains `training.promptsPerStep` groups of `algorithm.groupSize` trajectories:
a train call posts whole steps' worth (the rest of its groups is left out, with a warning), and a
group whose rollouts raised (fewer trajectories) is left out too.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterable, Optional

from grpojob.integrations import art_settings
from grpojob.integrations.art_endpoint import Forwarder
from grpojob.integrations.art_groups import EpisodeError, group_doc

__all__ = ["GRPOJobBackend", "BackendError"]

log = logging.getLogger("grpojob.integrations.art")


class BackendError(RuntimeError):
    """The job refused or did not answer; the message says what it said."""


def _env(name: str, environ) -> str:
    value = environ.get(name)
    if not value:
        raise BackendError(f"{name} is not set: run the ART script as a spec.environments command of a GRPOJob "
                           "(grpojob run and the operator set it), or give GRPOJobBackend(...) the value")
    return value


class GRPOJobBackend:
    """ART's Backend protocol (art.Backend) over a GRPOJob. Arguments default to what an
    environment process of the job gets."""

    def __init__(self, *, trajectory_url: Optional[str] = None, token: Optional[str] = None,
                 openai_base_urls: Optional[list[str]] = None, environment: Optional[str] = None,
                 config_path: Optional[str] = None, step_timeout: float = 1800.0, poll_seconds: float = 0.2,
                 keep_sampling: bool = False, environ=None):
        environ = os.environ if environ is None else environ
        self.trajectory_url = (trajectory_url or _env("GRPOJOB_TRAJECTORY_URL", environ)).rstrip("/")
        if token is None:
            path = environ.get("GRPOJOB_TOKEN_FILE")
            token = Path(path).read_text().strip() if path else _env("OPENAI_API_KEY", environ)
        self.token = token
        urls = openai_base_urls or [u for u in environ.get("GRPOJOB_OPENAI_BASE_URLS", "").split(",") if u]
        self.openai_base_urls = urls or [_env("OPENAI_BASE_URL", environ)]
        self.environment = environment or environ.get("GRPOJOB_ENVIRONMENT") or "art"
        self.replica = environ.get("GRPOJOB_REPLICA_ID")
        config_path = config_path or environ.get("GRPOJOB_CONFIG")
        doc = json.loads(Path(config_path).read_text()) if config_path and Path(config_path).is_file() else {}
        self.spec: dict[str, Any] = doc.get("spec", doc)
        self.step_timeout, self.poll_seconds, self.keep_sampling = step_timeout, poll_seconds, keep_sampling
        self.registration: Optional[dict[str, Any]] = None
        self._forwarder: Optional[Forwarder] = None
        self._http = None

    # ---- HTTP to the trainer leader -------------------------------------------------------------------
    def _client(self):
        import httpx  # openai's own dependency: there wherever ART is

        if self._http is None:
            self._http = httpx.AsyncClient(timeout=60.0, headers={"Authorization": f"Bearer {self.token}"})
        return self._http

    async def _call(self, method: str, path: str, body: Optional[dict] = None, *, retry_for: float = 0.0,
                    ok=(200,)) -> tuple[int, dict[str, Any]]:
        """(status, JSON) of a call to the leader; retries 503 (starting) and unreachable for `retry_for` s."""
        import httpx

        url = self.trajectory_url.removesuffix("/trajectories") + path  # the leader's root: /status too
        end = time.monotonic() + retry_for
        while True:
            try:
                r = await self._client().request(method, url, json=body)
                doc = r.json() if r.content else {}
                if r.status_code != 503 or time.monotonic() >= end:
                    if r.status_code not in ok:
                        raise BackendError(f"{method} {url}: {r.status_code} {doc.get('reason', '')} "
                                           f"{doc.get('error', doc)}".strip())
                    return r.status_code, doc
            except (httpx.TransportError, ValueError) as e:
                if time.monotonic() >= end:
                    raise BackendError(f"{method} {url}: {e!r}") from e
            await asyncio.sleep(1.0)

    async def _status(self) -> dict[str, Any]:
        return (await self._call("GET", "/trajectories/status", retry_for=60.0))[1]

    # ---- the Backend protocol -------------------------------------------------------------------------
    def _model_inference_name(self, model, step: Optional[int] = None) -> str:
        """The rollout servers serve the current policy under any name; ART's `name@step` is kept for logs."""
        return model.name if step is None else f"{model.name}@{step}"

    async def register(self, model) -> None:
        if not getattr(model, "trainable", False):
            return
        body = {"name": self.environment, **({"replica": self.replica} if self.replica else {})}
        _, self.registration = await self._call("POST", "/trajectories/register", body, retry_for=self.step_timeout)
        log.info("registered with the trajectory API as %r: groupSize %s, promptsPerStep %s", self.environment,
                 self.registration.get("group_size"), self.registration.get("prompts_per_step"))

    async def _prepare_backend_for_training(self, model, config=None) -> tuple[str, str]:
        if config:
            log.warning("ignored: the OpenAI server config %s is ART's LocalBackend's; the job's rollout servers "
                        "are set in spec.rollout", sorted(config))
        if self._forwarder is None:
            sampling = None if self.keep_sampling else (self.registration or {}).get("sampling")
            self._forwarder = Forwarder(self.openai_base_urls, sampling).start()
        return self._forwarder.base_url, self.token

    async def _get_step(self, model) -> int:
        return int((await self._status()).get("policy_version") or 0)

    async def _delete_checkpoint_files(self, model, steps_to_keep: list[int]) -> None:
        log.info("checkpoints are the job's (spec.checkpoint): nothing deleted for steps other than %s", steps_to_keep)

    async def close(self) -> None:
        if self._forwarder is not None:
            self._forwarder.close()
            self._forwarder = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _train_sft(self, model, trajectories, config, dev_config, verbose: bool = False) -> AsyncIterator[dict]:
        async def refuse():
            raise NotImplementedError("train_sft: a GRPOJob trains with RL from groups; supervised fine-tuning is "
                                      "not offered by the grpojob backend")
            yield {}  # pragma: no cover - makes this an async generator
        return refuse()

    async def train(self, model, trajectory_groups: Iterable[Any], **settings: Any):
        from art.types import TrainResult  # the installed ART's own result type

        art_settings.check(settings, self.spec)
        if self.registration is None:
            raise BackendError("train before register: call `await model.register(backend)` first")
        size, per_step = int(self.registration["group_size"]), int(self.registration["prompts_per_step"])
        docs, left_out = self._groups(list(trajectory_groups), size)
        steps = len(docs) // per_step
        if steps == 0:
            raise BackendError(f"{len(docs)} usable group(s) of {size} trajectories; a step of this job trains "
                               f"training.promptsPerStep = {per_step}: give train() at least that many"
                               + (f" ({'; '.join(left_out)})" if left_out else ""))
        if len(docs) % per_step:
            left_out.append(f"{len(docs) % per_step} group(s) beyond whole steps of {per_step}")
        if left_out:
            log.warning("not trained: %s", "; ".join(left_out))
        docs = docs[:steps * per_step]
        before = await self._status()
        trained0 = self._trained(before)
        version0 = int(before.get("policy_version") or 0)
        await self._post(docs)
        after = await self._wait(trained0 + len(docs), version0 + steps)
        return TrainResult(step=int(after.get("policy_version") or 0), metrics=await self._metrics(steps, len(left_out)))

    # ---- train's parts ----------------------------------------------------------------------------------
    def _groups(self, groups: list[Any], size: int) -> tuple[list[dict], list[str]]:
        docs, left_out = [], []
        for i, g in enumerate(groups):
            trajectories = list(getattr(g, "trajectories", g))
            raised = list(getattr(g, "exceptions", None) or ())
            if len(trajectories) != size:
                if raised and len(trajectories) < size:
                    first = f"{getattr(raised[0], 'type', '')}: {getattr(raised[0], 'message', raised[0])}"
                    left_out.append(f"group {i}: {len(raised)} rollout(s) raised ({first}), "
                                    f"{len(trajectories)} of {size} left")
                    continue
                raise BackendError(f"group {i} has {len(trajectories)} trajectories; this job's groups have "
                                   f"algorithm.groupSize = {size}: make the script's rollouts per group {size}")
            try:
                docs.append(group_doc(trajectories))
            except EpisodeError as e:
                left_out.append(f"group {i}: {e}")
        return docs, left_out

    def _trained(self, status: dict[str, Any]) -> int:
        mine = (status.get("environments") or {}).get(self.environment) or {}
        return int(mine.get("trained", 0)) + int(mine.get("stale", 0))

    async def _post(self, docs: list[dict]) -> None:
        end = time.monotonic() + self.step_timeout
        while docs:
            status, out = await self._call("POST", "/trajectories/groups", {"environment": self.environment,
                                                                           "groups": docs}, retry_for=60.0,
                                           ok=(200, 429))
            if status == 200:
                return
            if time.monotonic() >= end:  # 429: the queue is full of groups not yet trained
                raise BackendError(f"the trajectory API's queue stayed full for {self.step_timeout:.0f} s: {out}")
            await asyncio.sleep(self.poll_seconds)

    async def _wait(self, trained: int, version: int) -> dict[str, Any]:
        """Until this script's groups are trained (or dropped as stale), the trainer is at `version`
        and the rollout servers have its weights (the next rollouts sample the new policy)."""
        end = time.monotonic() + self.step_timeout
        every = int(((self.spec.get("weightSync") or {}).get("everySteps")) or 1)
        while True:
            s = await self._status()
            published = int(s.get("published_version") or 0)
            if self._trained(s) >= trained and int(s.get("policy_version") or 0) >= version \
                    and published >= version - (version % every):
                return s
            if time.monotonic() >= end:
                raise BackendError(f"the job did not train the posted groups within {self.step_timeout:.0f} s "
                                   f"(waiting for: {s.get('waiting_for')}; policy version {s.get('policy_version')}, "
                                   f"published {published})")
            await asyncio.sleep(self.poll_seconds)

    async def _metrics(self, steps: int, left_out: int) -> dict[str, float]:
        """The trainer's last step record (its /status), as numbers."""
        try:
            _, status = await self._call("GET", "/status")
        except BackendError:
            status = {}
        out = {k: float(v) for k, v in status.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and k not in ("step", "totalSteps", "policyVersion", "lastCheckpointStep")}
        return {**out, "job_steps": float(steps), "groups_left_out": float(left_out)}
