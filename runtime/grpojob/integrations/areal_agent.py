"""AReaL's agent workflows (AReaL >= 1.0: any class with `async def run(self, data, **extra_kwargs)`,
e.g. `areal.workflow.openai.math_agent.MathAgent`), unchanged, over our agent sessions.

Run as an environment of the job (`spec.environments[].command`, `rollout.workflow: none`):

    python -m grpojob.integrations.areal_agent --agent my_agent.py:MathAgent --data rows.jsonl \
        [--agent-kwargs '{"max_tokens": 8}']

`--agent` names the class (`module:Class` or `file.py:Class`; a file's path is relative to the working
directory or spec.code's, GRPOJOB_CODE_DIR) or an instance, resolved as AReaL's trainer resolves
`trainer.train(workflow=..., workflow_kwargs=...)`: a class is built with `--agent-kwargs` as its
keywords, an instance is used as it is. Each row of `--data` (.jsonl) is AReaL's `data` (e.g.
`messages`, `answer`), `--concurrency` rows at a time (default 2). Per row, `groupSize` episodes run concurrently, each one session of one
group (`X-Session-Group`), as AReaL's proxy runs them in its inline mode:

    reward = await agent.run(data, base_url=..., api_key=..., http_client=...)

`base_url` is the rollout servers' OpenAI endpoint (OPENAI_BASE_URL), `api_key` the job's token, and
`http_client` an `httpx.AsyncClient` carrying the session's headers: the agent passes it to its
`AsyncOpenAI(base_url=, api_key=, http_client=)` as AReaL's agents do, so every request it makes is a
turn of its session, recorded by the rollout servers with the exact tokens, log-probs and policy
versions (docs/agents.md: nothing re-tokenised; user and tool turns masked out). The reward is
AReaL's convention for `run`'s result: a number is the episode's reward (AReaL's
`set_last_reward`); a dict `{completion id: reward}` sets each response's reward (`set_reward`), and
the session, one whole trajectory like AReaL's `export_style="concat"` leaf, gets its last
response's (0 when the dict leaves it out, as AReaL warns and uses 0). It is posted to
`/v1/sessions/{id}/reward`; when groupSize sessions of the row have ended the group is trained.
An episode that raises is rejected (AReaL's way) and run again in a new session, at most
`--retries` times; its session is left to expire.

What is refused at start, naming the flag: an `--agent` that is an AReaL `RolloutWorkflow` (use
`spec.rollout.workflow` with grpojob.integrations.areal), or whose `run` is not async (AReaL's own
check); `--mode subproc` or `online` (the session is named by the http_client's headers, which a
subprocess agent reading OPENAI_BASE_URL does not send); `--export-style individual` (each turn
its own sample: a session here is one trajectory). `--turn-discount` is accepted for AReaL's
flags' sake and has no effect on a concat-style trajectory (the leaf keeps its own reward).

Environment: OPENAI_BASE_URL, GRPOJOB_TOKEN_FILE or OPENAI_API_KEY, GRPOJOB_CONFIG (group size),
GRPOJOB_ENVIRONMENT, GRPOJOB_TRAJECTORY_URL (pacing), GRPOJOB_CODE_DIR.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

from grpojob.integrations import job_env

__all__ = ["AgentError", "load_agent", "main", "play", "play_group", "session_reward"]

log = logging.getLogger("grpojob.integrations.areal_agent")


class AgentError(RuntimeError):
    """An episode whose result does not fit AReaL's convention (or our sessions), with the fix."""


def _load(ref: str) -> Any:
    source, sep, attr = ref.rpartition(":")
    if not sep or not source or not attr:
        raise SystemExit(f"--agent {ref!r}: name it as module:Class or file.py:Class")
    if source.endswith(".py"):
        places = [Path(source)] + ([Path(os.environ["GRPOJOB_CODE_DIR"]) / source]
                                   if os.environ.get("GRPOJOB_CODE_DIR") else [])
        path = next((p for p in places if p.is_file()), None)
        if path is None:
            raise SystemExit(f"--agent {ref!r}: no file {source} (looked in {', '.join(str(p) for p in places)})")
        sys.path.insert(0, str(path.resolve().parent))  # its neighbours import as AReaL's examples do
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"--agent {ref!r}: {source} has no attribute {attr!r}") from None
    return obj


def load_agent(ref: str, kwargs: Optional[dict] = None) -> Any:
    """The agent `ref` names, built as AReaL's trainer builds an agent workflow (class: with
    `kwargs`); SystemExit naming --agent when it is no AReaL agent."""
    obj = _load(ref) if isinstance(ref, str) else ref
    try:
        from areal.api.workflow_api import RolloutWorkflow
    except ImportError:  # AReaL not installed: an agent class needs none of it
        RolloutWorkflow = None
    if RolloutWorkflow is not None and (isinstance(obj, RolloutWorkflow) or
                                        (isinstance(obj, type) and issubclass(obj, RolloutWorkflow))):
        raise SystemExit(f"--agent {ref}: an AReaL RolloutWorkflow (arun_episode), not an agent: name it in "
                         "spec.rollout.workflow through grpojob.integrations.areal.workflow")
    agent = obj(**(kwargs or {})) if isinstance(obj, type) else obj
    run = getattr(type(agent), "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise SystemExit(f"--agent {ref}: {type(agent).__name__}.run is not an async function: an AReaL agent has "
                         "`async def run(self, data, **extra_kwargs)`")
    return agent


def session_reward(result: Any, response_ids: list[str]) -> float:
    """The session's reward from `run`'s result, AReaL's way (module docstring)."""
    if isinstance(result, bool) or not isinstance(result, (int, float, dict)):
        raise AgentError(f"the agent's run returned {type(result).__name__}: AReaL takes a float (the episode's "
                         "reward) or a dict {completion id: reward}")
    if not isinstance(result, dict):
        return float(result)
    unknown = [k for k in result if k not in response_ids]
    if unknown:
        raise AgentError(f"the agent's run returned rewards for {unknown[:3]}, which are no completion ids of its "
                         f"session ({response_ids[-3:]}...): key them by `completion.id`")
    return float(result.get(response_ids[-1], 0.0)) if response_ids else 0.0


def _response_id(body: bytes) -> Optional[str]:
    """The completion id in an OpenAI answer: a JSON body, or the first event of a stream."""
    text = body.decode(errors="replace").strip()
    if text.startswith("data:"):
        text = text.split("\n", 1)[0][5:].strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc.get("id") if isinstance(doc, dict) else None


async def play(agent: Any, row: dict, *, base_url: str, token: str, session: str, group: str,
               environment: str) -> dict:
    """One episode as one session: {"session", "reward", "responses" (each answer's JSON, in order)}."""
    import httpx

    responses: list[dict] = []

    async def seen(response):  # the completion ids the agent's reward dict keys on
        if response.request.url.path.endswith("completions") and response.status_code == 200:
            body = await response.aread()
            rid = _response_id(body)
            if rid is not None:
                responses.append({"id": rid, "body": body})

    headers = {"X-Session-Id": session, "X-Session-Group": group, "X-Session-Environment": environment}
    async with httpx.AsyncClient(headers=headers, timeout=600, event_hooks={"response": [seen]}) as http_client:
        result = await agent.run(json.loads(json.dumps(row)), base_url=base_url, api_key=token,
                                 http_client=http_client)
    if not responses:
        raise AgentError("the agent made no request through the http_client it was given: pass "
                         "extra_kwargs['http_client'] (and base_url, api_key) to its AsyncOpenAI, as AReaL's agents "
                         "do, so that its turns are recorded as a session")
    ids = [r["id"] for r in responses]
    return {"session": session, "reward": session_reward(result, ids), "result": result,
            "responses": [json.loads(r["body"]) if not r["body"].lstrip().startswith(b"data:") else None
                          for r in responses]}


async def play_group(agent: Any, http, base_url: str, token: str, row: dict, group_size: int, *,
                     environment: str = "areal", retries: int = 2) -> list[dict]:
    """groupSize episodes of one row, each session ended with its reward (the last one queues the
    group); an episode that raises is run again in a new session, at most `retries` times."""
    group = f"areal-{uuid.uuid4().hex[:16]}"

    async def one(i: int) -> dict:
        for attempt in range(retries + 1):
            sid = f"{group}-{i}-{attempt}"
            try:
                return await play(agent, row, base_url=base_url, token=token, session=sid, group=group,
                                  environment=environment)
            except Exception as e:  # noqa: BLE001 - AReaL rejects the trajectory of an agent that raises
                log.warning("episode %s rejected (%s: %s); attempt %d of %d", sid, type(e).__name__, e,
                            attempt + 1, retries + 1)
                last = e
        raise AgentError(f"an episode of the group failed {retries + 1} times: {last}")

    episodes = await asyncio.gather(*(one(i) for i in range(group_size)))
    for ep in episodes:
        r = await http.post(f"{base_url}/sessions/{ep['session']}/reward", json={"reward": ep["reward"]})
        if r.status_code != 200:
            raise AgentError(f"session {ep['session']}: the reward was refused: {r.status_code} {r.text}")
    return episodes


def load_rows(path: str) -> list[dict]:
    rows = job_env.json_lines(path)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise SystemExit(f"--data {path}: one JSON object a line (AReaL's `data` for each episode)")
    return rows


def check_args(args: argparse.Namespace) -> None:
    """What cannot run over our sessions: refused at start, naming the flag."""
    if args.mode != "inline":
        raise SystemExit(f"--mode {args.mode}: only AReaL's inline mode runs over sessions (the session is named "
                         "by the http_client's headers; a subprocess agent reading OPENAI_BASE_URL sends none)")
    if args.export_style != "concat":
        raise SystemExit(f"--export-style {args.export_style}: a session is one trajectory (AReaL's concat "
                         "export: the exact tokens of every turn, context masked out), not one sample per turn")


async def main_async(args: argparse.Namespace) -> None:
    import httpx

    check_args(args)
    kwargs = json.loads(args.agent_kwargs or "{}")
    if not isinstance(kwargs, dict):
        raise SystemExit("--agent-kwargs: a JSON object (AReaL's workflow_kwargs)")
    agent = load_agent(args.agent, kwargs)
    rows = load_rows(args.data)
    spec = job_env.config().get("spec", {})
    group_size = args.group_size or int((spec.get("algorithm") or {}).get("groupSize") or 8)
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
    token = job_env.token()
    environment = os.environ.get("GRPOJOB_ENVIRONMENT", "areal")
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async def one(i: int) -> None:
            eps = await play_group(agent, http, base, token, rows[i % len(rows)], group_size,
                                   environment=environment, retries=args.retries)
            log.info("group of row %d: rewards %s", i % len(rows), [round(e["reward"], 3) for e in eps])

        # `--concurrency` groups at a time: their sessions batch together on the rollout servers
        await job_env.play_groups(one, groups=args.groups, concurrency=args.concurrency, http=http,
                                  trajectories=os.environ.get("GRPOJOB_TRAJECTORY_URL"),
                                  errors=(AgentError, httpx.HTTPError))


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grpojob.integrations.areal_agent",
                                description="AReaL's agent workflows (async run(data, **extra_kwargs)) over sessions")
    p.add_argument("--agent", required=True, help="module:Class or file.py:Class (or an instance)")
    p.add_argument("--agent-kwargs", help="JSON: the class's keywords (AReaL's workflow_kwargs)")
    p.add_argument("--data", required=True, help="rows (.jsonl): each episode's `data`")
    p.add_argument("--retries", type=int, default=2, help="runs again of an episode that raised")
    job_env.group_flags(p, concurrency="groups in flight at once")
    p.add_argument("--mode", default="inline", help="AReaL's agent mode: inline only (see above)")
    p.add_argument("--export-style", default="concat", help="AReaL's export_style: concat only (see above)")
    p.add_argument("--turn-discount", type=float, default=1.0, help="AReaL's turn_discount (no effect on concat)")
    job_env.run_driver(p, main_async, argv)


if __name__ == "__main__":
    main()
