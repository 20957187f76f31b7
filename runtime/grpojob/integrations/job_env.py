"""What an environment process started by a GRPOJob (spec.environments) reads from its environment
(the job's token, its manifest, its files) and how it paces its groups to the trainer. Shared by the
adapters that run as such processes (the skyrl-gym, verifiers and AReaL agent drivers)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

log = logging.getLogger("grpojob.integrations")


def token() -> str:
    """The job's token: GRPOJOB_TOKEN_FILE (what the job gives its environments), else OPENAI_API_KEY."""
    path = os.environ.get("GRPOJOB_TOKEN_FILE")
    if path:
        return Path(path).read_text().strip()
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise SystemExit("neither GRPOJOB_TOKEN_FILE nor OPENAI_API_KEY is set: the job's token is needed "
                         "(spec.environments get GRPOJOB_TOKEN_FILE from the job)")
    return key


def config() -> dict:
    """The job's manifest (GRPOJOB_CONFIG), or {} where none is given."""
    path = os.environ.get("GRPOJOB_CONFIG")
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}


def json_lines(path: str, flag: str = "--data") -> list:
    """The JSON values of a .jsonl file named by `flag`: as given (relative to the working directory),
    else under spec.code's directory (GRPOJOB_CODE_DIR: in a pod, the ConfigMap that brought the
    environment's files, while the working directory is the image's); SystemExit naming both places."""
    places = [Path(path)]
    if not Path(path).is_absolute() and os.environ.get("GRPOJOB_CODE_DIR"):
        places.append(Path(os.environ["GRPOJOB_CODE_DIR"]) / path)
    found = next((p for p in places if p.is_file()), None)
    if found is None:
        raise SystemExit(f"{flag} {path}: no such file (looked in {', '.join(str(p.absolute()) for p in places)})")
    try:
        return [json.loads(line) for line in found.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag} {found}: not JSON lines ({e})") from None


async def wait_for_room(http, trajectories: Optional[str]) -> None:
    """Until the trainer has room for another group (its queue and the full groups waiting for it
    below the queue's limit), as the arithmetic example paces itself: groups made far ahead go stale."""
    while trajectories:
        try:
            s = (await http.get(f"{trajectories.rstrip('/')}/status")).json()
            waiting = s.get("queued", 0) + (s.get("sessions") or {}).get("ready_groups", 0)
            if s.get("started") and waiting < s.get("queue_limit", 1):
                return
        except Exception:  # noqa: BLE001 - not up yet: wait like the trainer's other clients
            pass
        await asyncio.sleep(0.5)


async def play_groups(play: Callable[[int], Awaitable[Any]], *, groups: int, concurrency: int, http,
                      trajectories: Optional[str], errors: tuple, retry_s: float = 2.0) -> int:
    """`play(i)` for the i-th group (i = 0, 1, ...: a driver's row or task i modulo their count),
    `concurrency` groups in flight at once, each started once the trainer has room. Workers, not
    batches: one slow group holds up only its own worker. A group failing with one of `errors` is
    logged and played again; any other exception ends the driver. Stops after `groups` (0: never).
    Returns how many were played."""
    if concurrency < 1:
        raise SystemExit(f"--concurrency {concurrency}: at least 1 group at a time")
    started = done = 0

    async def worker() -> None:
        nonlocal started, done
        while groups <= 0 or started < groups:
            i, started = started, started + 1
            while True:
                await wait_for_room(http, trajectories)
                try:
                    await play(i)
                    break
                except errors as e:
                    log.warning("group %d failed (%s); playing it again in %.0f s", i, e, retry_s)
                    await asyncio.sleep(retry_s)
            done += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def group_flags(p: argparse.ArgumentParser, concurrency: Optional[str] = None) -> None:
    """The drivers' shared flags: group size, how many groups, and (`concurrency`: its help) how many
    groups in flight at once."""
    p.add_argument("--group-size", type=int, default=0, help="default: the job's algorithm.groupSize")
    p.add_argument("--groups", type=int, default=0, help="stop after this many groups (0: until stopped)")
    if concurrency:
        p.add_argument("--concurrency", type=int, default=2, help=concurrency)


def run_driver(p: argparse.ArgumentParser, run: Callable[[argparse.Namespace], Awaitable[Any]],
               argv: Optional[list[str]]) -> None:
    """A driver's main: log to stderr (the job's environment log), then run it on the parsed flags."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    asyncio.run(run(p.parse_args(argv)))
