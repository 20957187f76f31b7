"""skyrl-gym (0.4) environments, unchanged, played with SkyRL's agent loop over our agent sessions.

Run as an environment of the job (`spec.environments[].command`):

    python -m grpojob.integrations.skyrl_gym --data rows.jsonl [--env-class gsm8k] [--import my_envs]

Each row is a SkyRL dataset row: `prompt` (chat messages), `env_class` (a registered skyrl-gym id;
`--env-class` is the default), and the env's extras (`reward_spec`, `extra_info`, ...: every other
field, as SkyRL's generator passes them). `--import` imports a module first (one that calls
`skyrl_gym.register(...)` for environments of your own). Per row, `groupSize` sessions of one group
(`X-Session-Group`) play SkyRL's loop:

    env = skyrl_gym.make(env_class, env_config=..., extras=row's extras)
    messages, _ = env.init(prompt)
    until done (or --max-turns): reply = policy(messages); out = env.step(reply)
                                 messages += [assistant reply, *out["observations"]]

Each turn is one `/v1/chat/completions` request with the session's headers, so the rollout servers
record the exact tokens turn by turn and the observations (and the template's markers) are masked
out of training, as SkyRL's generator masks them (docs/agents.md). The episode's reward is the
SUM of its per-turn rewards (SkyRL's return; gsm8k gives one turn's), posted to
`/v1/sessions/{id}/reward` with `reward_parts` `{"last_turn": the last turn's reward}`.
Differences from SkyRL's generator: its token-level chat-template bookkeeping is the rollout servers'
(docs/agents.md: exact tokens across turns); sampling is the job's `rollout.sampling` (sessions
take it whatever the request says); a row's episodes never share an environment instance.

Environment: OPENAI_BASE_URL (the rollout servers' /v1), GRPOJOB_TOKEN_FILE or OPENAI_API_KEY (the
job's token), GRPOJOB_CONFIG (the job's runtime config: group size, max tokens), GRPOJOB_ENVIRONMENT.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import uuid
from typing import Any, Optional

from grpojob.integrations import job_env

__all__ = ["main", "play", "play_group"]

log = logging.getLogger("grpojob.integrations.skyrl_gym")
_ROW_KEYS = ("prompt", "env_class")


def extras_of(row: dict) -> dict:
    """What SkyRL's generator passes as `extras`: every field but the prompt and the env class."""
    return {k: v for k, v in row.items() if k not in _ROW_KEYS}


async def play(client, row: dict, *, session: str, group: str, environment: str, env_class: Optional[str] = None,
               env_config: Any = None, max_turns: int = 8, max_tokens: Optional[int] = None) -> dict:
    """One episode of `row` as one session: {"reward", "turns", "rewards" (per turn), "session"}."""
    import skyrl_gym

    name = row.get("env_class") or env_class
    if not name:
        raise ValueError("a row without env_class, and no --env-class: name the skyrl-gym environment")
    env = skyrl_gym.make(name, env_config=env_config, extras=extras_of(row))
    headers = {"X-Session-Id": session, "X-Session-Group": group, "X-Session-Environment": environment}
    messages, _ = env.init([dict(m) for m in row["prompt"]])
    messages = list(messages)
    rewards: list[float] = []
    try:
        for _ in range(max_turns):
            resp = await client.chat.completions.create(model="policy", messages=messages, max_tokens=max_tokens,
                                                        extra_headers=headers)
            reply = resp.choices[0].message.content or ""
            out = env.step(reply)
            rewards.append(float(out["reward"] or 0.0))
            messages += [{"role": "assistant", "content": reply}, *(out.get("observations") or [])]
            if out["done"]:
                break
    finally:
        env.close()
    return {"session": session, "reward": sum(rewards), "rewards": rewards, "turns": len(rewards)}


async def play_group(client, http, base_url: str, row: dict, group_size: int, **kw) -> list[dict]:
    """groupSize sessions of one row, each ended with its reward (the last one queues the group)."""
    group = f"g-{uuid.uuid4().hex[:16]}"
    episodes = await asyncio.gather(*(play(client, row, session=f"{group}-{i}", group=group, **kw)
                                      for i in range(group_size)))
    for ep in episodes:
        r = await http.post(f"{base_url}/sessions/{ep['session']}/reward",
                            json={"reward": ep["reward"], "reward_parts": {"last_turn": ep["rewards"][-1]}})
        if r.status_code != 200:
            raise RuntimeError(f"session {ep['session']}: the reward was refused: {r.status_code} {r.text}")
    return episodes




def load_rows(path: str) -> list[dict]:
    rows = job_env.json_lines(path)
    bad = [i for i, r in enumerate(rows) if not (isinstance(r, dict) and isinstance(r.get("prompt"), list))]
    if not rows or bad:
        raise SystemExit(f"{path}: every row needs `prompt` as a list of chat messages (SkyRL's dataset rows); "
                         f"{'no rows' if not rows else f'rows {bad[:5]} have none'}")
    return rows


async def main_async(args: argparse.Namespace) -> None:
    import httpx
    import openai

    for module in args.imports:
        importlib.import_module(module)  # registers the user's own environments
    rows = load_rows(args.data)
    cfg = job_env.config()
    group_size = args.group_size or int(cfg.get("spec", {}).get("algorithm", {}).get("groupSize", 0) or 8)
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
    token = job_env.token()
    environment = os.environ.get("GRPOJOB_ENVIRONMENT", "skyrl-gym")
    client = openai.AsyncOpenAI(base_url=base, api_key=token, max_retries=8)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async def one(i: int) -> None:
            eps = await play_group(client, http, base, rows[i % len(rows)], group_size, environment=environment,
                                   env_class=args.env_class, max_turns=args.max_turns, max_tokens=args.max_tokens)
            log.info("group of row %d: rewards %s", i % len(rows), [round(e["reward"], 3) for e in eps])

        await job_env.play_groups(one, groups=args.groups, concurrency=args.concurrency, http=http,
                                  trajectories=os.environ.get("GRPOJOB_TRAJECTORY_URL"),
                                  errors=(openai.APIConnectionError, openai.APIStatusError, httpx.HTTPError,
                                          RuntimeError))


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m grpojob.integrations.skyrl_gym", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="SkyRL dataset rows (.jsonl)")
    p.add_argument("--env-class", help="the skyrl-gym id for rows without env_class")
    p.add_argument("--import", dest="imports", action="append", default=[], help="a module to import first")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=None, help="per turn (default: the job's rollout.sampling)")
    job_env.group_flags(p, concurrency="groups in flight at once (their sessions batch together on the "
                        "rollout servers)")
    job_env.run_driver(p, main_async, argv)


if __name__ == "__main__":
    main()
