"""verifiers v1 (0.4.x) environments, unchanged, as an environment of the job:

    python -m grpojob.integrations.verifiers --taskset ID [--env-config JSON] [--groups N]

(`python -m grpojob.integrations.verifiers` runs this driver when the installed verifiers is 0.4
or newer.) The environment is loaded as verifiers' own entry points load it,
`vf.load_environment(vf.resolve_env_config(config))`, with `config` the EnvConfig data (`--env-config`,
verifiers' `--env.*` flags as JSON; `--taskset` sets `taskset.id`), every agent seat's runtime
`subprocess` unless the config names one (verifiers' default is a remote sandbox). Under
`env.serving()`, for each task in turn, `groupSize` slots (`env.slots(task, groupSize)`) run with
`env.run_slot(slot, ctx)`; `ctx`'s client is verifiers' eval client pointed at the rollout servers,
which sends every turn, streamed, with `X-Session-ID` = the trace id: the rollout servers record the
exact tokens and log-probs of each turn (docs/agents.md), so nothing is re-tokenised. The driver
adds `X-Session-Group` (one per task's slots) and `X-Session-Environment`, and ends each trace's
session with `trace.reward` (and its named rewards as `reward_parts`). A failed episode still
posts a reward (what it recorded; 0 when its rewards did not run) so its group completes; a slot
that failed before its first model call (no session to end) is run again, up to `--retries` times.

Each rollout of verifiers' chat harnesses (null, bash) is a PEP 723 script run with `uv`: `uv`
must be on PATH (or in `$GRPOJOB_SITE_DIR/bin`, where `spec.code.pip: [uv]` installs it), and the
script's packages come from the index on its first `uv sync` (or offline from wheels:
`UV_NO_INDEX=1`, `UV_FIND_LINKS=<dir>`). Without uv the driver refuses at start, naming the fix.

Environment: OPENAI_BASE_URL, GRPOJOB_TOKEN_FILE (or OPENAI_API_KEY), GRPOJOB_CONFIG (group size,
sampling), GRPOJOB_ENVIRONMENT, GRPOJOB_TRAJECTORY_URL (pacing), GRPOJOB_SITE_DIR.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

from grpojob.integrations import job_env

__all__ = ["env_config", "find_uv", "main", "play_group", "session_reward"]

log = logging.getLogger("grpojob.integrations.verifiers")
KEY_VAR = "GRPOJOB_VERIFIERS_API_KEY"  # read by its client config; "API_KEY" keeps it out of rollouts
UV_FIX = ("verifiers runs each rollout of its chat harnesses as a uv script, and `uv` is not on PATH (nor in "
          "$GRPOJOB_SITE_DIR/bin). Fix: add `uv` to the environment's image, or `spec.code.pip: [\"uv>=0.9\"]` "
          "(installed by the pod's install-code init container; this driver finds it there), or `pip install uv` "
          "locally. The script's packages (openai, mcp, httpx...) come from the index on its first `uv sync`; "
          "offline, give wheels: env UV_NO_INDEX=1 and UV_FIND_LINKS=<a directory of wheels>")


def find_uv() -> Optional[str]:
    """uv's path: on PATH, or where `spec.code.pip` put it ($GRPOJOB_SITE_DIR/bin, then added to PATH)."""
    site = os.environ.get("GRPOJOB_SITE_DIR")
    if site and (Path(site) / "bin" / "uv").is_file():
        os.environ["PATH"] = f"{Path(site) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return shutil.which("uv")


def env_config(data: dict, taskset: Optional[str] = None) -> Any:
    """The EnvConfig verifiers resolves from `data`, every agent seat on the subprocess runtime
    unless `data` names its runtime."""
    import verifiers.v1 as vf

    data = json.loads(json.dumps(data))
    if taskset:
        data.setdefault("taskset", {})["id"] = taskset
    first = vf.resolve_env_config(data)
    for name, value in first:
        if isinstance(value, vf.AgentConfig) and "runtime" not in (data.get(name) or {}):
            data.setdefault(name, {})["runtime"] = {"type": "subprocess"}
    return vf.resolve_env_config(data)


def session_reward(trace) -> dict:
    """The reward body for a trace's session: its reward and named parts (0 when none ran)."""
    parts = {name: float(r.value) for name, r in (trace.rewards or {}).items() if r is not None}
    return {"reward": float(trace.reward), "reward_parts": parts}


async def play_group(env, task, http, base_url: str, model_ctx, group_size: int, retries: int = 2) -> list:
    """groupSize episodes of `task` as one session group; each trace's session ended with its reward.
    Returns the episodes (a retried slot's last attempt)."""
    slots = env.slots(task, group_size)

    async def one(slot):
        for attempt in range(retries + 1):
            ep = await env.run_slot(slot, model_ctx)
            ended = 0
            for trace in ep.traces:
                r = await http.post(f"{base_url}/sessions/{trace.id}/reward", json=session_reward(trace))
                if r.status_code == 200:
                    ended += 1
                elif r.status_code != 404:  # 404: no model call was served under this trace
                    raise RuntimeError(f"session {trace.id}: the reward was refused: {r.status_code} {r.text}")
            if ended:
                return ep
            err = ep.errors[-1].message if ep.errors else (ep.traces[-1].last_error.message
                                                          if ep.traces and ep.traces[-1].last_error else "no turn")
            log.warning("a slot of task %s ended before any model call (%s); attempt %d of %d", task.key[:12],
                        err[-500:], attempt + 1, retries + 1)
            slot = env.slots(task, 1)[0]
        raise RuntimeError(f"task {task.key[:12]}: a slot never reached the model in {retries + 1} attempts: "
                           "its group cannot complete")

    return list(await asyncio.gather(*(one(s) for s in slots)))




async def run(args: argparse.Namespace) -> int:
    import httpx
    import verifiers.v1 as vf

    data = json.loads(args.env_config or "{}")
    if not isinstance(data, dict):
        raise SystemExit("--env-config: a JSON object (verifiers' EnvConfig: taskset, agent, ...)")
    config = env_config(data, args.taskset)
    seats = {name: v for name, v in config if isinstance(v, vf.AgentConfig)}
    uv = find_uv()
    if any(isinstance(v.runtime, vf.SubprocessConfig) for v in seats.values()) and not uv:
        raise SystemExit(UV_FIX)
    # Pods (and the runtime image) set PYTHONDONTWRITEBYTECODE: without bytecode in the chat program's
    # uv environment every rollout's process compiles openai's and mcp's 2,867 files again (measured:
    # 5.7 s of CPU per rollout's start, 3.9 s with it; the compile is about 15 s once per environment)
    os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
    from importlib import metadata

    log.info("verifiers %s from %s, uv %s", metadata.version("verifiers"), Path(vf.__file__).parents[2], uv)
    env = vf.load_environment(config)
    tasks = list(env.taskset.take(args.tasks) if args.tasks > 0 else env.taskset)
    if not tasks:
        raise SystemExit(f"taskset {config.taskset.id!r} gave no task")
    spec = job_env.config().get("spec", {})
    group_size = args.group_size or int((spec.get("algorithm") or {}).get("groupSize") or 8)
    s = (spec.get("rollout") or {}).get("sampling") or {}
    sampling = vf.Sampling(max_tokens=s.get("maxTokens", 256), temperature=s.get("temperature", 1.0),
                           top_p=s.get("topP", 1.0))
    token = job_env.token()
    os.environ[KEY_VAR] = token
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
    name = os.environ.get("GRPOJOB_ENVIRONMENT", "verifiers")
    trajectories, sent = os.environ.get("GRPOJOB_TRAJECTORY_URL"), 0
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async def one(i: int) -> None:
            task = tasks[i % len(tasks)]
            headers = {"X-Session-Group": f"vf-{uuid.uuid4().hex[:16]}", "X-Session-Environment": name}
            ctx = vf.ModelContext(model="policy", sampling=sampling,
                                  client=vf.EvalClientConfig(base_url=base, api_key_var=KEY_VAR, headers=headers))
            eps = await play_group(env, task, http, base, ctx, group_size, args.retries)
            log.info("group of task %d: rewards %s", i % len(tasks),
                     [round(t.reward, 3) for e in eps for t in e.traces])

        while args.groups <= 0 or sent < args.groups:
            # the interception server keeps one client per distinct client config (one per group here):
            # serve again every --refresh groups so they do not pile up
            n = args.refresh if args.groups <= 0 else min(args.refresh, args.groups - sent)
            async with env.serving():
                sent += await job_env.play_groups(lambda i, at=sent: one(at + i), groups=n,
                                                  concurrency=min(args.concurrency, n), http=http,
                                                  trajectories=trajectories, errors=(RuntimeError, httpx.HTTPError),
                                                  retry_s=1.0)
    return sent


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grpojob.integrations.verifiers",
                                description="verifiers v1 (0.4) environments as an environment of the job")
    p.add_argument("--taskset", help="the taskset id (an installed or importable package; sets taskset.id)")
    p.add_argument("--env-config", help="verifiers' EnvConfig as JSON (what its --env.* flags set)")
    p.add_argument("--tasks", type=int, default=0, help="the first N tasks only (0: all)")
    p.add_argument("--retries", type=int, default=2, help="runs again of a slot that never reached the model")
    p.add_argument("--refresh", type=int, default=64, help="groups per env.serving() (see above)")
    job_env.group_flags(p, concurrency="groups in flight at once (their slots batch together on the rollout servers)")
    job_env.run_driver(p, run, argv)


if __name__ == "__main__":
    main()
