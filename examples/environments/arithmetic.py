"""An Atropos-style environment: small additions, asked of the policy over the rollout servers'
OpenAI endpoint, scored here, pushed to the trainer's trajectory API as scored groups.

    grpojob run examples/environments/arithmetic.yaml   # starts it next to the trainer

It needs only `openai` and `httpx` (no grpojob import), and reads what the job gives every
environment process (grpojob.plan):
    OPENAI_BASE_URL, GRPOJOB_OPENAI_BASE_URLS   the rollout servers (/v1), one or a comma list
    GRPOJOB_TRAJECTORY_URL                      the trajectory API (register, groups, status)
    GRPOJOB_ENVIRONMENT                         the name to register under
    GRPOJOB_TOKEN_FILE                          the job's token: the bearer of every call (the
                                                OpenAI API key too, unless OPENAI_API_KEY is set)
and its own settings: ARITHMETIC_MAX_OPERAND (default 4), ARITHMETIC_GROUPS_PER_STEP (a commitment
per training step; unset: none), ARITHMETIC_BATCH (groups generated and submitted together), SEED.

Each group is one problem and groupSize completions. The token ids and log-probs the trainer
needs come back from /v1/completions with `logprobs` and the `return_token_ids` extension (as
vLLM offers it): `prompt_token_ids`, `token_ids`, `logprobs.token_logprobs`, and the choice's
`policy_version` (`token_versions` when a weight push landed mid-generation). Rewards are this
environment's own, in two parts that the trainer's metrics show by name: `number` (the share of
the completion's words that are integers) and `correct` (its first integer is the sum).
"""
from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import httpx
import openai
from openai import OpenAI

_WORD = re.compile(r"-?\d+|[^\W\d_]+|[^\s\w]")


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def score(text: str, answer: int) -> dict[str, float]:
    words = _WORD.findall(text)
    numbers = [w for w in words if w.lstrip("-").isdecimal()]
    return {"number": len(numbers) / len(words) if words else 0.0,
            "correct": 1.0 if numbers and int(numbers[0]) == answer else 0.0}


class Arithmetic:
    def __init__(self, name: str, api: str, openai_urls: list[str], max_operand: int, seed: int):
        self.name, self.api = name, api.rstrip("/")
        token = open(os.environ["GRPOJOB_TOKEN_FILE"]).read().strip()
        key = os.environ.get("OPENAI_API_KEY") or token
        self.clients = [OpenAI(base_url=u, api_key=key, max_retries=5) for u in openai_urls]
        self.http = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"})
        self.rng = random.Random(seed)
        self.max_operand = max_operand
        self.calls = 0
        self.job: dict[str, Any] = {}

    def register(self, groups_per_step: Optional[int]) -> None:
        while True:
            try:
                r = self.http.post(f"{self.api}/register", json={"name": self.name, "groups_per_step": groups_per_step,
                                                                 "replica": os.environ.get("GRPOJOB_REPLICA_ID")})
            except httpx.TransportError as e:  # the trainer is still starting
                log("waiting for the trainer", error=str(e))
                time.sleep(1)
                continue
            if r.status_code == 503:
                time.sleep(1)
                continue
            r.raise_for_status()
            self.job = r.json()  # group_size, sampling, published_version, ...
            log("registered", **self.job)
            return

    def group(self, a: int, b: int, seed: int) -> dict[str, Any]:
        """One problem, groupSize completions, sampled as the trainer computes log-probs."""
        s = self.job["sampling"]
        client = self.clients[self.calls % len(self.clients)]
        self.calls += 1
        resp = client.completions.create(
            model="policy", prompt=f"question : what is {a} + {b} ? answer :", n=self.job["group_size"],
            max_tokens=s["max_tokens"], temperature=s["temperature"], top_p=s["top_p"], logprobs=1,
            seed=seed, extra_body={"top_k": s["top_k"], "return_token_ids": True})
        completions, rewards, parts = [], [], {"number": [], "correct": []}
        for ch in resp.choices:
            extra = ch.model_extra or {}
            c = {"token_ids": extra["token_ids"], "logprobs": ch.logprobs.token_logprobs,
                 "finish_reason": ch.finish_reason, "text": ch.text}
            if extra.get("token_versions") is not None:
                c["versions"] = extra["token_versions"]
            else:
                c["policy_version"] = extra["policy_version"]
            completions.append(c)
            got = score(ch.text, a + b)
            for k, v in got.items():
                parts[k].append(v)
            rewards.append(sum(got.values()))
        prompt_ids = (resp.choices[0].model_extra or {})["prompt_token_ids"]
        return {"prompt_ids": prompt_ids, "prompt": f"{a} + {b}", "completions": completions,
                "rewards": rewards, "reward_parts": parts}

    def room(self) -> int:
        """Groups the trainer's queue takes now (0 while it is full or not started)."""
        st = self.http.get(f"{self.api}/status").json()
        return 0 if not st.get("started") else st["queue_limit"] - st["queued"]

    def submit(self, groups: list[dict[str, Any]]) -> bool:
        """True when accepted; False when the trainer asks to retry later or forgot us."""
        r = self.http.post(f"{self.api}/groups", json={"environment": self.name, "groups": groups})
        doc = r.json()
        if r.status_code == 200:
            log("submitted", groups=len(groups), queued=doc["queued"], version_floor=doc["version_floor"],
                reward_mean=sum(sum(g["rewards"]) for g in groups) / sum(len(g["rewards"]) for g in groups))
            return True
        log("refused", status=r.status_code, reason=doc.get("reason"), error=doc.get("error"))
        if r.status_code == 404:  # a trainer restarted without a checkpoint: register again
            self.register(self.job.get("groups_per_step"))
        elif r.status_code == 400:  # our bug: say it and stop
            sys.exit(f"the trajectory API refused our groups: {doc.get('error')}")
        return r.status_code == 409  # stale groups are dropped, not retried

    def run(self, batch: int, groups_per_step: Optional[int]) -> None:
        self.register(groups_per_step)
        with ThreadPoolExecutor(max_workers=batch) as pool:
            while True:  # until stopped (SIGTERM): the trainer or rollout servers may restart meanwhile
                try:
                    self.step(pool, batch)
                except (httpx.TransportError, openai.APIConnectionError) as e:
                    log("unreachable, retrying", error=str(e))
                    time.sleep(1)

    def step(self, pool: ThreadPoolExecutor, batch: int) -> None:
        n = min(batch, self.room())
        if n <= 0:
            time.sleep(0.2)
            return
        problems = [(self.rng.randint(0, self.max_operand), self.rng.randint(0, self.max_operand),
                     self.rng.randrange(2 ** 31)) for _ in range(n)]
        groups = list(pool.map(lambda p: self.group(*p), problems))
        while not self.submit(groups):
            time.sleep(0.5)


def main() -> None:
    env = os.environ
    urls = (env.get("GRPOJOB_OPENAI_BASE_URLS") or env["OPENAI_BASE_URL"]).split(",")
    quota = env.get("ARITHMETIC_GROUPS_PER_STEP")
    Arithmetic(env.get("GRPOJOB_ENVIRONMENT", "arithmetic"), env["GRPOJOB_TRAJECTORY_URL"], urls,
               int(env.get("ARITHMETIC_MAX_OPERAND", "4")), int(env.get("SEED", "0"))
               ).run(int(env.get("ARITHMETIC_BATCH", "4")), int(quota) if quota else None)


if __name__ == "__main__":
    main()
