"""Reward scoring: built-ins by name, user functions by `module:function`, sync or async.

A reward function is written in one of the signatures of `forms` (grpojob's own, cosmos-rl's, TRL's
or verl's) and called in that signature's meaning. Rewards are summed with their weights. A result
may carry parts of its own (cosmos-rl's `(value, dict)`, verl's `{"score": ..., ...}`): their numeric
entries are reported as `<reward>/<part>` beside the reward (Group.reward_parts), not summed.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Sequence, Union

from grpojob.api import plugins
from grpojob.data import messages_field
from grpojob.data.config import CosmosConfig
from grpojob.api.data import DatasetSpec
from grpojob.api.judge import JudgeSpec
from grpojob.api.spec import GRPOJobSpec, RewardSpec
from grpojob.contracts.rollout import Completion, Group, Sample
from grpojob.rewards.builtin import REWARDS
from grpojob.rewards.forms import Binding, FormError, bind
from grpojob.rewards.judges import GroupSkipped, JudgeClient, JudgeDown, JudgeRefused, JudgeUnavailable, urls_from_env
from grpojob.auth import Auth

log = logging.getLogger("grpojob.rewards")

RewardFn = Callable[..., Union[Any, Awaitable[Any]]]


class RewardError(RuntimeError):
    pass


def check_function(fn, spec: Optional[RewardSpec] = None) -> Optional[str]:
    """Why `fn` cannot serve as the reward `spec` declares (its signature and args), or None."""
    if not callable(fn):
        return "is not callable (a reward function is expected)"
    try:
        bind(fn, spec.signature if spec else "auto", spec.args if spec else None)
    except FormError as e:
        return str(e)
    return None


def resolve(spec: RewardSpec, where: str) -> tuple[RewardFn, Binding]:
    fn = REWARDS[spec.name] if spec.name in REWARDS else plugins.resolve(spec.name)
    if not callable(fn):
        raise RewardError(f"{where}: reward '{spec.name}' is not callable")
    try:
        return fn, bind(fn, spec.signature, spec.args)
    except FormError as e:
        raise RewardError(f"{where}: '{spec.name}' {e}") from None


@dataclass(frozen=True)
class ScoringSettings:
    """What scoring reads of a job: its rewards, the judges they name, and the dataset whose rows
    the rewards see (the training set's, or an evaluation set's)."""
    rewards: Sequence[RewardSpec]
    judges: Sequence[JudgeSpec] = ()
    dataset: Optional[DatasetSpec] = None
    job: Optional[GRPOJobSpec] = None  # only for cosmos-rl rewards' config= (CosmosConfig)

    @classmethod
    def of(cls, spec: GRPOJobSpec) -> "ScoringSettings":
        return cls(rewards=tuple(spec.rewards), judges=tuple(spec.judges), dataset=spec.dataset, job=spec)


class RewardScorer:
    """Fills Group.rewards (weighted sum per completion) and Group.reward_parts (per reward name).
    `settings`: ScoringSettings, or a job's spec (what a plug-in holds) to take them from."""

    def __init__(self, settings: Union[ScoringSettings, GRPOJobSpec], tokenizer: Any):
        s = settings if isinstance(settings, ScoringSettings) else ScoringSettings.of(settings)
        self.settings, self.tokenizer = s, tokenizer
        self.specs = list(s.rewards)
        self.fns = [None if r.judge else resolve(r, f"spec.rewards[{i}].name") for i, r in enumerate(self.specs)]
        self.names = reward_names(s.rewards)
        self.judges = judge_clients(s.judges) if s.judges else {}
        self.config = CosmosConfig(s.job) if s.job is not None else None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    async def _score(self, i: int, sample: Sample, comps: list[Completion]) -> Scored:
        """Reward i of each completion (None: a trl-form reward did not score it), and the parts its
        results carried ({part: one value or None per completion})."""
        texts = [c.text or self.decode(c.completion_ids) for c in comps]
        if self.specs[i].judge:
            return await self._judge(i, sample, texts), {}
        fn, binding = self.fns[i]
        form, args = binding.form.name, self.specs[i].args
        where = f"reward '{self.specs[i].name}' (spec.rewards[{i}])"
        try:
            if binding.form.batched:
                call = self._trl_args(sample, comps, texts, args) if form == "trl" else \
                    self._args(form, sample, texts, args)
                out = await _settle(binding.call(fn, *call))
                out, details = _split_batch(out, len(comps), where)
                values = _as_list(out)
                if values is None or len(values) != len(comps):
                    raise RewardError(f"{where} returned {out!r}: a {form} reward returns a list of "
                                      f"{len(comps)} floats{' (or None)' if form == 'trl' else ''}, one per completion")
            else:
                outs = await asyncio.gather(*(_settle(binding.call(fn, *self._args(form, sample, t, args)))
                                              for t in texts))
                values, details = [], []
                for out in outs:
                    v, d = _split(out, where)
                    values.append(v)
                    details.append(d)
                if any(v is None for v in values):
                    raise RewardError(f"{where} returned None (a {form} reward returns a float)")
            values = [None if v is None else float(v) for v in values]
        except RewardError:
            raise
        except Exception as e:  # a user's reward failing must name itself
            raise RewardError(f"{where} failed: {type(e).__name__}: {e}") from e
        bad = [v for v in values if v is not None and not math.isfinite(v)]
        if bad:
            raise RewardError(f"{where} returned {bad[0]}")
        return values, _parts(details)

    async def _judge(self, i: int, sample: Sample, texts: list[str]) -> list[Optional[float]]:
        """A judge's scores; when it cannot score, its onFailure: zero (0 each), skip (GroupSkipped:
        the manager generates the prompt again), fail (the step fails)."""
        client = self.judges[self.specs[i].judge]
        try:
            return list(await client.score(sample.prompt, texts))
        except JudgeRefused as e:
            raise RewardError(f"spec.rewards[{i}] (judge '{client.spec.name}'): {e}") from None
        except JudgeDown as e:  # down for its startupTimeoutSeconds: no onFailure waits longer
            raise RewardError(f"spec.rewards[{i}] (judge '{client.spec.name}', onFailure "
                              f"{client.spec.on_failure}): {e}") from None
        except JudgeUnavailable as e:
            if client.spec.on_failure == "zero":
                log.warning("%s: scoring the group 0 (onFailure zero)", e, extra={"sample": sample.index})
                return [0.0] * len(texts)
            if isinstance(e, GroupSkipped):
                log.warning("%s: skipping the group, its prompt is generated again (onFailure skip)", e)
                raise
            raise RewardError(f"spec.rewards[{i}] (judge '{client.spec.name}', onFailure fail): {e}") from None

    def _args(self, form: str, sample: Sample, text: Any, args: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        """One completion's arguments (cosmos-group: the group's texts): (first, second, keywords) in
        the form's meaning."""
        row = {k: v for k, v in sample.row.items() if k not in ("prompt", "completion")}
        if form in ("cosmos", "cosmos-group"):  # cosmos-rl: the rollout text and the dataset's reference answer
            return text, row.get("answer"), {"prompt": sample.prompt, "tokenizer": self.tokenizer,
                                             "config": self.config, **args}
        if form == "verl":  # verl's dataset format: reward_model.ground_truth, data_source, extra_info
            model = row.get("reward_model")
            truth = model["ground_truth"] if isinstance(model, dict) and "ground_truth" in model else row.get("answer")
            return text, truth, {"data_source": row.get("data_source"), "extra_info": row.get("extra_info"), **args}
        return sample.prompt, text, {**row, **args}

    def _trl_args(self, sample: Sample, comps: list[Completion], texts: list[str],
                  args: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        """TRL's batch for one group: the dataset's prompt and each completion, as messages when
        the prompt is a conversation (TRL's conversational format), else as text; the row's other
        columns repeated per completion; completion_ids."""
        n, row, d = len(comps), sample.row, self.settings.dataset  # a job with rewards has a dataset
        chat = messages_field(d, row)
        if chat and isinstance(row.get(chat), list):
            prompt, completions = row[chat], [[{"role": "assistant", "content": t}] for t in texts]
        else:
            prompt, completions = row.get(d.prompt_field, sample.prompt), texts
        skip = {"prompt", "completion", "completion_ids", chat, d.prompt_field}
        columns = {k: [v] * n for k, v in row.items() if k not in skip}
        return [prompt] * n, completions, {**columns, "completion_ids": [list(c.completion_ids) for c in comps],
                                           **args}

    async def score_group(self, group: Group) -> None:
        parts: dict[str, list[Optional[float]]] = {}
        details: dict[str, list[Optional[float]]] = {}
        for i, name in enumerate(self.names):
            parts[name], own = await self._score(i, group.sample, group.completions)
            details.update({f"{name}/{k}": v for k, v in own.items()})
        total = []
        for j, c in enumerate(group.completions):
            if c.reward is not None:  # a workflow that scores its own trajectories wins
                total.append(float(c.reward))
                continue
            scored = [(r.weight, parts[n][j]) for r, n in zip(self.specs, self.names) if parts[n][j] is not None]
            if not scored:
                log.warning("no reward scored a completion (every trl reward returned None): reward 0",
                            extra={"sample": group.sample.index})
            total.append(sum(w * v for w, v in scored))
        # Metrics average what each reward scored (TRL's nanmean).
        group.rewards = total
        group.reward_parts = {n: [v for v in vs if v is not None] for n, vs in {**parts, **details}.items()}
        if group.baseline is not None:  # greedy-baseline workflow (ReMax): its reward is the baseline
            values = [(await self._score(i, group.sample, [group.baseline]))[0][0] for i in range(len(self.specs))]
            group.baseline_reward = sum(r.weight * v for r, v in zip(self.specs, values) if v is not None)


Scored = tuple[list[Optional[float]], dict[str, list[Optional[float]]]]


def _split(out: Any, where: str) -> tuple[Any, Optional[dict]]:
    """One result as (value, its parts or None): cosmos-rl's (value, dict), verl's {"score": ...}."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out[0], out[1]
    if isinstance(out, dict):
        if "score" not in out:
            raise RewardError(f"{where} returned a dict without 'score' ({sorted(out)}): a verl reward's dict "
                              f"holds the reward as 'score' and parts to report beside it")
        return out["score"], {k: v for k, v in out.items() if k != "score"}
    return out, None


def _split_batch(out: Any, n: int, where: str) -> tuple[Any, list[Optional[dict]]]:
    """A batched result as (values, parts per completion): cosmos-rl's (list, list of dicts)."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list) and \
            all(isinstance(d, dict) for d in out[1]):
        if len(out[1]) != n:
            raise RewardError(f"{where} returned {len(out[1])} dicts of parts for {n} completions")
        return out[0], list(out[1])
    return out, [None] * n


def _parts(details: list[Optional[dict]]) -> dict[str, list[Optional[float]]]:
    """The numeric parts of each completion's result, by name (None where a result lacks one); other
    entries (texts, lists) are not metrics and are left out."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and math.isfinite(float(v))

    names = sorted({k for d in details if d for k, v in d.items() if number(v)})
    return {k: [float(d[k]) if d and number(d.get(k)) else None for d in details] for k in names}


async def _settle(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _as_list(out: Any) -> Optional[list[Any]]:
    """A batched reward's output as a list (a list, tuple, array...), or None when it is not one."""
    if isinstance(out, (str, bytes, dict)):
        return None
    try:
        return list(out)
    except TypeError:
        return None


def judge_clients(judges: Sequence[JudgeSpec]) -> dict[str, JudgeClient]:
    """A client per spec.judges entry, at the addresses the plan gave the trainer (GRPOJOB_JUDGE_URLS)."""
    urls, token = urls_from_env(), Auth.from_env().token
    return {j.name: JudgeClient(j, urls.get(j.name) or [], token, f"spec.judges[{i}]") for i, j in enumerate(judges)}


def reward_names(rewards: Sequence[RewardSpec]) -> list[str]:
    """One metric name per reward function: its name (the attribute of a 'module:function'),
    numbered when the same function appears twice."""
    names, seen = [], {}
    for r in rewards:
        base = r.judge if r.judge else r.name.split(":")[-1]
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names
