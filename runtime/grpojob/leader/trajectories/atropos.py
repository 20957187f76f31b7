"""Atropos's run-api, the environment side, on the trainer leader: an unchanged atroposlib
`BaseEnv` (`serve --env.rollout_server_url http://<trainer>:<port>/trajectories/atropos/<token>`)
registers, paces itself and submits ScoredData, which become groups of the trajectory API.

Routes (under ATROPOS_PREFIX/<the job's token>: Atropos sends no Authorization header, so the
token is the path's; grpojob.leader.server checks it):
- POST /register-env {max_token_length, desired_name, weight, group_size, ...} -> {"status": "wait
  for trainer to start"} until the trainer has started, then {"status": "success", "env_id",
  "wandb_name", "starting_step", "checkpoint_dir": "", "checkpoint_interval": 0, "num_steps"}; it
  registers `atropos-<desired_name>` with the trajectory API (groups taken as they come).
- GET /info -> {"batch_size": promptsPerStep x groupSize (sequences), "max_token_len"}.
- GET /status-env (a JSON body {"env_id"} on a GET) -> {"current_step", "queue_size" (queued
  groups), "self_queue_size", "max_group_size", "unallocated_fraction", "env_weight"}; a full queue
  reads as queue_size = its limit, so the environment waits rather than posts into a 429.
- GET /wandb_info -> {"group": null, "project": null} (run environments with --env.use_wandb false).
- POST /scored_data, /scored_data_list (gzip-aware) -> {"status": "received"}; POST /disconnect-env.

A ScoredData group becomes one group: its sequences' common prefix before their first trained
token is the prompt; each rest is a completion whose loss mask is 0 where Atropos's `masks` are
-100; log-probs are `inference_logprobs` (required: `--openai.server_type vllm` gives them);
rewards are `scores`. Each trained span's policy versions are looked up from the rollout
servers' record of what they generated (rollout/token_api.py, `/vllm/versions`): a span no rollout
server generated (another server's tokens, re-tokenised text) is refused with a 400 that says so.
`overrides` (one dict per sequence) and `group_overrides` are honoured as atroposlib's own trainer
(example_trainer/data.py) and BaseEnv read them:
- `overrides[i].set_advantage_to_zero`: sequence i is not trained on (its loss mask is all 0) while
  its score still counts in the group's advantage statistics, as Atropos zeroes it after normalising;
- `temperature` (`overrides[i]`, else `generation_params`, else `group_overrides`): the temperature
  the trainer computes that sequence's log-probs at. The trainer computes every sequence at
  `rollout.sampling.temperature`, so another one is refused naming the field and the fix;
- `group_overrides.group_size`: a group of another size than `--env.group_size`; the job trains
  groups of `algorithm.groupSize` only, so another size is refused naming it.
Other keys (atroposlib's trainer reads none: `sft`, ...) are ignored. Atropos's `advantages` and
`ref_logprobs` are not used: the job's algorithm computes advantages (and its reference).
"""
from __future__ import annotations

import gzip
import json
import re
from typing import Any, Callable, Optional


ATROPOS_PREFIX = "/atropos"
Lookup = Callable[[list[list[int]]], list[Optional[list[int]]]]  # sequences -> per-token versions or None
MASKED = -100  # Atropos's mask value of tokens not trained on


class Refusal(Exception):
    pass


def decode_body(body: bytes, headers) -> Any:
    """JSON of a body, gunzipped when the request says gzip (Atropos compresses bodies >= 1 KB)."""
    if not body:
        return {}
    if (headers.get("Content-Encoding") or headers.get("content-encoding") or "").lower() == "gzip":
        body = gzip.decompress(body)
    return json.loads(body)


def _env_name(desired: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", (desired or "env").lower()).strip("-")[:40] or "env"
    return f"atropos-{slug}"


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of trained positions."""
    out, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _temperature_of(data: dict, i: int, per: list) -> tuple[Optional[str], Any]:
    """Where sequence i's temperature is set, and its value (atroposlib's trainer's priority)."""
    own = per[i] if i < len(per) else None
    for name, d in ((f"overrides[{i}]", own), ("generation_params", data.get("generation_params")),
                    ("group_overrides", data.get("group_overrides"))):
        if isinstance(d, dict) and d.get("temperature") is not None:
            return f"{name}.temperature", d["temperature"]
    return None, None


def overrides(data: dict, n: int, group_size: Optional[int] = None,
              temperature: Optional[float] = None) -> list[bool]:
    """Which of the n sequences are not trained on (`set_advantage_to_zero`); Refusal for overrides
    the job cannot honour (another temperature or group size), naming the field and the fix."""
    group, per = data.get("group_overrides"), data.get("overrides")
    if group is not None and not isinstance(group, dict):
        raise Refusal("group_overrides: a JSON object is expected")
    if per is not None and (not isinstance(per, list) or not all(d is None or isinstance(d, dict) for d in per)
                            or len(per) > n):
        raise Refusal(f"overrides: a list of at most {n} objects (one per sequence) is expected")
    group, per = group or {}, per or []
    size = group.get("group_size")
    if group_size is not None and (n != group_size or size not in (None, group_size)):
        raise Refusal(f"a group of {size if size is not None else n} sequences"
                      f"{' (group_overrides.group_size)' if size is not None else ''}: the job trains groups of "
                      f"algorithm.groupSize = {group_size}; send groups of that size (--env.group_size {group_size})")
    for i in range(n):
        field, t = _temperature_of(data, i, per)
        if field is None or temperature is None:
            continue
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise Refusal(f"{field}: {t!r} is not a number")
        if abs(float(t) - float(temperature)) > 1e-6:
            raise Refusal(f"{field} = {t}: the trainer computes log-probs at rollout.sampling.temperature = "
                          f"{temperature}; sample at that temperature, or set rollout.sampling.temperature: {t}")
    return [bool((per[i] or {}).get("set_advantage_to_zero")) if i < len(per) else False for i in range(n)]


def to_group_doc(data: dict, lookup: Lookup, group_size: Optional[int] = None,
                 temperature: Optional[float] = None) -> dict:
    """One ScoredData (a dict) as a group of the trajectory API's wire (wire.GroupIn)."""
    tokens, masks, scores = data.get("tokens"), data.get("masks"), data.get("scores")
    lps = data.get("inference_logprobs")
    if not isinstance(tokens, list) or not tokens or not isinstance(masks, list) or not isinstance(scores, list):
        raise Refusal("a ScoredData needs tokens, masks and scores (lists, one entry per sequence)")
    if lps is None:
        raise Refusal("ScoredData without inference_logprobs: the trainer needs the sampling log-probs; run the "
                      "environment with --openai.server_type vllm against the job's rollout servers (/vllm/v1)")
    if not (len(tokens) == len(masks) == len(scores) == len(lps)):
        raise Refusal(f"{len(tokens)} token lists, {len(masks)} masks, {len(scores)} scores, {len(lps)} "
                      "inference_logprobs: one each per sequence")
    for i, (t, m, lp) in enumerate(zip(tokens, masks, lps)):
        if not (len(t) == len(m) == len(lp)):
            raise Refusal(f"sequence {i}: {len(t)} tokens, {len(m)} masks, {len(lp)} inference_logprobs")
    zeroed = overrides(data, len(tokens), group_size, temperature)
    firsts = [next((k for k, m in enumerate(ms) if m != MASKED), None) for ms in masks]
    if any(f is None for f in firsts):
        raise Refusal(f"sequence {firsts.index(None)} has no trained token (every mask is -100)")
    common = 0
    while common < min(firsts) and all(t[common] == tokens[0][common] for t in tokens):
        common += 1
    if common == 0:
        raise Refusal("the sequences share no prompt (their first tokens differ, or a trained token comes first)")
    trained = [[int(m != MASKED) for m in ms[common:]] for ms in masks]
    queries, where = [], []
    for i, mask in enumerate(trained):
        for s, e in _spans(mask):
            queries.append(tokens[i][:common + e])
            where.append((i, s, e))
    found = lookup(queries)
    versions = [[-1] * len(m) for m in trained]
    for (i, s, e), got in zip(where, found):
        if got is None or len(got) < e - s:
            raise Refusal(f"sequence {i}: tokens {common + s}..{common + e} were not generated by this job's rollout "
                          "servers (or too long ago): generate with --openai.server_type vllm and "
                          "--openai.base_url http://<rollout>/vllm/v1, and submit the tokens as served")
        versions[i][s:e] = got[len(got) - (e - s):]
    completions = []
    for i, mask in enumerate(trained):
        first = next(v for v in versions[i] if v >= 0)
        filled, last = [], first
        for v in versions[i]:  # untrained positions take the version before them (the wire wants one per token)
            last = v if v >= 0 else last
            filled.append(last)
        mask = [0] * len(mask) if zeroed[i] else mask  # set_advantage_to_zero: not trained on
        completions.append({"token_ids": tokens[i][common:], "loss_mask": mask, "versions": filled,
                            "logprobs": [float(lp) if m else 0.0 for lp, m in zip(lps[i][common:], mask)]})
    return {"prompt_ids": tokens[0][:common], "completions": completions, "rewards": [float(s) for s in scores]}


class AtroposAPI:
    """The routes above over the TrajectoryAPI (its submit validates and queues)."""

    def __init__(self, trajectories, lookup: Lookup, *, batch_size: int, total_steps: int):
        self.trajectories, self.lookup = trajectories, lookup
        self.batch_size, self.total_steps = batch_size, total_steps
        self.envs: list[dict] = []

    def _status(self) -> dict:
        return self.trajectories.manager.environment_status()

    def handle(self, method: str, route: str, headers, body: bytes) -> tuple[int, dict]:
        try:
            doc = decode_body(body, headers)
        except (ValueError, OSError) as e:
            return 400, {"error": f"the body is not JSON (or not gzip as it says): {e}", "reason": "invalid"}
        routes = {("POST", "/register-env"): self.register, ("GET", "/info"): self.info,
                  ("GET", "/status-env"): self.status_env, ("GET", "/wandb_info"): self.wandb_info,
                  ("POST", "/scored_data"): self.scored, ("POST", "/scored_data_list"): self.scored_list,
                  ("POST", "/disconnect-env"): self.disconnect}
        fn = routes.get((method, route))
        if fn is None:
            return 404, {"error": f"no Atropos route {method} {route}: the environment side of run-api is served "
                                  "(register-env, info, status-env, wandb_info, scored_data(_list), disconnect-env)"}
        return fn(doc)

    def register(self, doc: dict) -> tuple[int, dict]:
        status = self._status()
        if not status.get("started"):
            return 200, {"status": "wait for trainer to start"}
        group_size = self.trajectories.limits.group_size
        if doc.get("group_size") not in (None, group_size):
            return 400, {"error": f"group_size {doc.get('group_size')}: the job's algorithm.groupSize is {group_size}; "
                                  f"run the environment with --env.group_size {group_size}", "reason": "invalid"}
        name = _env_name(str(doc.get("desired_name") or "env"))
        code, out = self.trajectories.register(json.dumps({"name": name}).encode())
        if code != 200:
            return code, out
        self.envs.append({"name": name, "connected": True})
        return 200, {"status": "success", "env_id": len(self.envs) - 1, "wandb_name": name, "checkpoint_dir": "",
                     "starting_step": status.get("steps_taken", 0), "checkpoint_interval": 0,
                     "num_steps": self.total_steps}

    def info(self, doc: dict) -> tuple[int, dict]:
        return 200, {"batch_size": self.batch_size, "max_token_len": self.trajectories.limits.max_sequence_tokens}

    def status_env(self, doc: dict) -> tuple[int, dict]:
        s = self._status()
        env = self._env(doc)
        mine = (s.get("environments", {}).get(env["name"], {}) if env else {}).get("queued", 0)
        # a full queue reads as full: the environment's own pacing (max_batches_offpolicy) waits
        queued = s.get("queue_limit", 0) if s.get("queued", 0) >= s.get("queue_limit", 1 << 30) else s.get("queued", 0)
        return 200, {"current_step": s.get("steps_taken", 0), "queue_size": queued, "self_queue_size": mine,
                     "max_group_size": self.trajectories.limits.group_size, "unallocated_fraction": 1.0,
                     "env_weight": 1.0}

    def wandb_info(self, doc: dict) -> tuple[int, dict]:
        return 200, {"group": None, "project": None}

    def _env(self, doc: Any) -> Optional[dict]:
        i = doc.get("env_id") if isinstance(doc, dict) else None
        return self.envs[i] if isinstance(i, int) and 0 <= i < len(self.envs) else None

    def scored(self, doc: Any) -> tuple[int, dict]:
        return self.scored_list([doc])

    def scored_list(self, docs: Any) -> tuple[int, dict]:
        if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
            return 400, {"error": "a list of ScoredData objects is expected", "reason": "invalid"}
        env = self._env(docs[0]) if docs else None
        if env is None:
            return 404, {"error": "unknown env_id: register first (POST register-env)", "reason": "unregistered"}
        try:
            groups = [to_group_doc(d, self.lookup, self.trajectories.limits.group_size,
                                   (self.trajectories.sampling or {}).get("temperature")) for d in docs]
        except Refusal as e:
            self.trajectories.manager.count_refused(env["name"], "invalid", len(docs))
            return 400, {"error": str(e), "reason": "invalid"}
        code, out = self.trajectories.submit(json.dumps({"environment": env["name"], "groups": groups}).encode())
        return code, ({"status": "received", "groups_processed": len(docs), **out} if code == 200 else out)

    def disconnect(self, doc: dict) -> tuple[int, dict]:
        env = self._env(doc)
        if env is None:
            return 200, {"status": "failure", "error": "unknown env_id"}
        env["connected"] = False
        return 200, {"status": "success"}


def http_lookup(addresses: Callable[[], list[str]], token: str, timeout: float = 10.0) -> Lookup:
    """A Lookup that asks every rollout server (`addresses()`: their base URLs) for its record."""
    import urllib.request

    def lookup(sequences: list[list[int]]) -> list[Optional[list[int]]]:
        found: list[Optional[list[int]]] = [None] * len(sequences)
        for url in addresses():
            missing = [i for i, v in enumerate(found) if v is None]
            if not missing:
                break
            req = urllib.request.Request(f"{url.rstrip('/')}/vllm/versions", method="POST",
                                         data=json.dumps({"sequences": [sequences[i] for i in missing]}).encode(),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    got = json.loads(r.read())["versions"]
            except (OSError, ValueError, KeyError):
                continue  # a server that is gone or restarted knows nothing: the others may
            for i, v in zip(missing, got):
                found[i] = v
        return found
    return lookup
