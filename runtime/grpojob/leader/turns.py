"""Turn-taking with a colocated engine (spec.placement colocated), trainer rank 0's side.

Generation and training share the device, so they alternate: before a step trains, rank 0 asks
the engine to sleep and waits until it is asleep (every rank waits with it: the loop's barrier);
after training it wakes the engine, then pushes the weights, then generation goes on. The engine's
side is grpojob.rollout.turns (POST /sleep, /wake_up, /memory). Each call returns the engine's
numbers for the step record: how long the turn took, decode steps run so far (equal at sleep and
wake: nothing was decoded while the trainer trained), bytes freed, and the engine process's peak
resident memory in the phase that just ended.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import logging
from typing import Callable, Optional, Protocol

import torch

from grpojob.learner import dist

log = logging.getLogger("grpojob.trainer")
DESCRIPTION = "colocated (turn-taking)"  # /status placement: generation and training alternate


class TurnError(RuntimeError):
    pass


class EngineTurns:
    def __init__(self, urls: Callable[[], list[str]], token: str, *, device: torch.device, timeout: float = 600.0):
        """`urls`: the base URLs of the colocated engine's server (the publisher's registered ones)."""
        self.urls, self.timeout, self.device = urls, timeout, device
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def sleep(self) -> dict:
        return self._all("/sleep", {"level": 1}, turn=True)

    def wake(self) -> dict:
        return self._all("/wake_up", {}, turn=True)

    def mark(self, phase: str) -> dict:
        return self._all("/memory", {"phase": phase}, turn=False)

    def _all(self, path: str, body: dict, *, turn: bool) -> dict:
        """Every server's answer, folded: numbers summed (one engine when colocated), the seconds the
        whole call took, and after a turn (sleep, wake) the device's memory in use once every engine
        got there (CUDA)."""
        t0 = time.perf_counter()
        replies = [self._post(url, path, body) for url in self.urls()]
        out: dict = {"servers": len(replies)}
        for reply in replies:
            for key, value in reply.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out[key] = out.get(key, 0) + value
        out["seconds"] = time.perf_counter() - t0
        if turn and self.device.type == "cuda":  # both processes' memory on this GPU
            free, total = torch.cuda.mem_get_info(self.device)
            out["device_used_bytes"] = total - free
        return out

    def _post(self, url: str, path: str, body: dict) -> dict:
        req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), headers=self._headers,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise TurnError(f"{url}{path}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from None
        except (urllib.error.URLError, OSError) as e:
            raise TurnError(f"{url}{path}: {e}") from None


class Placement(Protocol):
    """Where generation runs relative to training, chosen once per run (leader.build): the loop
    calls `turn` at each step's boundaries and reports `description` in /status."""
    description: str

    def turn(self, kind: str) -> dict:
        """kind "sleep" (before the step trains), "wake" (after), "sync" (after the push): the
        engine's numbers for the step record ({} when there is nothing to do)."""
        ...


class Separate:
    """The rollout servers have devices of their own: nothing to alternate."""
    description = "separate"

    def turn(self, kind: str) -> dict:
        return {}


class TurnTaking:
    """spec.placement colocated: rank 0 puts the engine to sleep before the step trains (every rank
    waits until it is asleep), wakes it after, and reads its memory peak after the push. `turns`
    is None on the other ranks: they only wait at each sleep."""
    description = DESCRIPTION

    def __init__(self, turns: Optional[EngineTurns], env: dist.DistEnv):
        self.turns, self.env = turns, env

    def turn(self, kind: str) -> dict:
        out: dict = {}
        if self.turns is not None:
            try:
                out = self.turns.sleep() if kind == "sleep" else self.turns.wake() if kind == "wake" else \
                    self.turns.mark(kind)
            except TurnError as e:  # an engine restarting: it catches up when it registers again
                log.warning("the colocated engine did not %s: %s", kind, e)
                out = {"error": str(e)}
        if kind == "sleep" and self.env.world > 1:  # no rank trains before the engine is asleep
            dist.all_max(torch.zeros(1), self.env)
        return out
