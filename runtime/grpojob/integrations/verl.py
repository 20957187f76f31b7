"""verl's agent loops (`verl.experimental.agent_loop.AgentLoopBase` subclasses: its own
`SingleTurnAgentLoop`, a user's) as a GRPOJob's rollout workflow, unchanged.

A user's file names the loop class and wraps it:

    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from grpojob.integrations.verl import agent_loop

    SINGLE_TURN = agent_loop(SingleTurnAgentLoop)      # spec.rollout.workflow: my_loops.py:SINGLE_TURN

The loop is constructed as verl's AgentLoopWorker constructs one (`trainer_config`, `server_manager`,
`tokenizer`, `processor` None, `dataset_cls` verl's RLHFDataset, `data_config`, `hf_model_type` from
the model's config, `tools` empty), inside the running event loop (verl's loops keep the loop they
were built in). Its config is an omegaconf DictConfig in struct mode holding what grpojob has
(`actor_rollout_ref.rollout`: prompt_length = dataset.maxPromptLength, response_length =
rollout.sampling.maxTokens, temperature, top_p, top_k, calculate_log_probs, n = groupSize,
full_determinism; `data`: apply_chat_template_kwargs, mm_processor_kwargs; plus `overrides` given
to `agent_loop`): a loop reading a setting grpojob lacks is refused at start (StartRefused) naming
the setting, never mid-run.

For each prompt the group is `groupSize` concurrent `loop.run(sampling_params, **row)` calls, as
verl runs `rollout.n` per prompt: the row's fields as verl's dataset gives them (`raw_prompt`: the
row's chat messages, else its prompt as one user message; `data_source`, `reward_model`,
`extra_info`... as they are; `index`: the sample's). `server_manager.generate(request_id,
prompt_ids=, sampling_params=)` generates one completion on the rollout servers at the spec's
sampling (the trainer's log-probs are at the spec's temperature; `max_tokens`/`max_new_tokens` at
most `maxTokens`) and answers verl's `TokenOutput` (token ids, log-probs, stop reason). Multimodal
data (images, videos, audio) is refused (the rollout servers take token ids only). The loop's
`AgentLoopOutput` becomes the completion exactly (grpojob.integrations.episodes): `prompt_ids`,
`response_ids`, `response_mask` (tool tokens not trained on), `response_logprobs`, and
`reward_score` as the completion's reward when set; each generated segment keeps the policy
version it was generated with.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

from grpojob.contracts.rollout import Completion, Generator, Group, Sample, SamplingParams
from grpojob.integrations.episodes import Episode, EpisodeError, to_group

__all__ = ["ServerManager", "agent_loop", "config_for"]

FIELD = "spec.rollout.workflow"
_calls: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("grpojob_verl_calls", default=None)


class ServerManager:
    """What a verl agent loop's `server_manager` is here: `generate` on the job's rollout servers."""

    def __init__(self, client: Generator, sampling: SamplingParams):
        self.client, self.sampling = client, sampling

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        media = [n for n, v in (("image_data", image_data), ("video_data", video_data), ("audio_data", audio_data),
                                ("mm_processor_output", kwargs.get("mm_processor_output"))) if v]
        if media:
            raise EpisodeError(f"{FIELD}: the verl agent loop sent {', '.join(media)}: grpojob's rollout servers "
                               "generate from token ids only (no multimodal input)")
        limit = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        sampling = dataclasses.replace(self.sampling, max_tokens=min(int(limit), self.sampling.max_tokens)
                                       if limit else self.sampling.max_tokens)
        (c,) = await self.client.generate([int(t) for t in prompt_ids], 1, sampling)
        calls = _calls.get()
        if calls is not None:
            calls.append(c)
        return TokenOutput(token_ids=list(c.completion_ids), log_probs=list(c.logprobs),
                           stop_reason="completed", extra_fields={})


def config_for(spec, overrides: Optional[dict] = None):
    """The verl config an agent loop reads: what grpojob has, under verl's names (struct mode)."""
    from omegaconf import OmegaConf

    s, d = spec.rollout.sampling, spec.dataset
    rollout = {"prompt_length": d.max_prompt_length if d is not None else 1024, "response_length": s.max_tokens,
               "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "calculate_log_probs": True,
               "n": spec.algorithm.group_size, "full_determinism": False}
    base = {"actor_rollout_ref": {"rollout": rollout}, "data": {"apply_chat_template_kwargs": {},
                                                               "mm_processor_kwargs": {}}}
    cfg = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides or {}))
    OmegaConf.set_struct(cfg, True)
    return cfg


def _model_type(spec) -> Optional[str]:
    try:
        t = json.loads((Path(spec.model.path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, TypeError):
        return None
    return t if isinstance(t, str) else None


def _row_kwargs(sample: Sample) -> dict[str, Any]:
    """The row as verl's RLHFDataset gives it to a loop: `raw_prompt` (chat messages) and the rest."""
    row = dict(sample.row)
    messages = row.get("raw_prompt")
    if messages is None:
        prompt = row.get("prompt", row.get("messages"))
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(
            prompt if isinstance(prompt, str) else sample.prompt)}]
    row["raw_prompt"] = list(messages)
    row.setdefault("index", sample.index)
    return row


def _versions(mask: list[int], calls: list[Completion]) -> Optional[list[int]]:
    """One version per response token: each run of trained tokens takes the version of the generate
    call it came from, in order (None: the runs do not line up with the calls)."""
    runs, at = [], 0
    while at < len(mask):
        if mask[at]:
            end = at
            while end < len(mask) and mask[end]:
                end += 1
            runs.append((at, end))
            at = end
        else:
            at += 1
    if len(runs) != len(calls):
        return None
    out = [calls[0].policy_version if calls else 0] * len(mask)
    for (a, b), c in zip(runs, calls):
        out[a:b] = [c.versions[i] if c.versions and i < len(c.versions) else c.policy_version for i in range(b - a)]
    return out


def _episode(out: Any, calls: list[Completion], limit: int) -> Episode:
    mask = [int(m) for m in out.response_mask]
    if out.response_logprobs is None:
        raise EpisodeError(f"{FIELD}: the verl agent loop returned no response_logprobs (grpojob trains on the "
                           "rollout's log-probs: keep its assistant_logprobs)")
    versions = _versions(mask, calls)
    oldest = min((c.policy_version for c in calls), default=0)
    return Episode(prompt_ids=[int(t) for t in out.prompt_ids], completion_ids=[int(t) for t in out.response_ids],
                   logprobs=[float(v) for v in out.response_logprobs], loss_mask=mask, versions=versions,
                   reward=None if out.reward_score is None else float(out.reward_score),
                   finish_reason="length" if len(mask) >= limit else "stop", version=oldest)


def agent_loop(loop_cls: type, overrides: Optional[dict] = None) -> type:
    """A grpojob workflow class (constructed as Class(spec, tokenizer)) running the verl agent loop
    class `loop_cls`; `overrides`: more of verl's config (a nested dict) for loops that read it."""

    class VerlAgentLoop:
        def __init__(self, spec, tokenizer):
            self.spec, self.tokenizer = spec, tokenizer
            self.group_size = spec.algorithm.group_size
            self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
            self.config = config_for(spec, overrides)
            self.params = {"temperature": self.sampling.temperature, "top_p": self.sampling.top_p,
                           "top_k": self.sampling.top_k, "repetition_penalty": 1.0, "logprobs": True}
            self._loops: dict[int, Any] = {}
            # built once now, in an event loop of its own: refused at start, not mid-run, when it needs what we lack
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, self._probe()).result()

        def _build(self, server_manager) -> Any:
            from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
            from verl.utils.dataset.rl_dataset import RLHFDataset

            try:
                return loop_cls(trainer_config=DictConfigWrap(config=self.config), server_manager=server_manager,
                                tokenizer=self.tokenizer, processor=None, dataset_cls=RLHFDataset,
                                data_config=DictConfigWrap(self.config.data), hf_model_type=_model_type(self.spec),
                                tools=ToolListWrap([]))
            except Exception as e:  # noqa: BLE001 - the loop's own constructor: refused with its reason
                raise ValueError(f"{FIELD}: the verl agent loop {loop_cls.__name__} cannot be built here: "
                                 f"{type(e).__name__}: {e} (grpojob's verl config holds "
                                 f"{sorted(self.config.actor_rollout_ref.rollout)} under actor_rollout_ref.rollout; "
                                 "pass more with agent_loop(cls, overrides={...}))") from None

        async def _probe(self) -> None:
            self._build(ServerManager(None, self.sampling))

        def _loop(self, client: Generator) -> Any:
            key = id(asyncio.get_running_loop())  # built inside the running event loop, once per loop
            if key not in self._loops:
                self._loops[key] = self._build(_ClientRouter())
            return self._loops[key]

        async def _episode(self, loop, client, sample: Sample) -> Episode:
            calls: list[Completion] = []
            token = _calls.set(calls)
            _client.set(ServerManager(client, self.sampling))
            try:
                out = await loop.run(dict(self.params), **_row_kwargs(sample))
            finally:
                _calls.reset(token)
            return _episode(out, calls, self.config.actor_rollout_ref.rollout.response_length)

        async def run(self, client: Generator, sample: Sample) -> Group:
            loop = self._loop(client)
            episodes = await asyncio.gather(*(self._episode(loop, client, sample) for _ in range(self.group_size)))
            return to_group(sample, episodes, self.tokenizer)

    VerlAgentLoop.__qualname__ = VerlAgentLoop.__name__ = f"VerlAgentLoop[{loop_cls.__name__}]"
    return VerlAgentLoop


_client: contextvars.ContextVar[Optional[ServerManager]] = contextvars.ContextVar("grpojob_verl_client", default=None)


class _ClientRouter:
    """The one server_manager a loop is built with: each call goes to the client of the episode
    that made it (a context variable), so one loop serves every group concurrently."""

    async def generate(self, request_id: str, **kwargs: Any):
        manager = _client.get()
        if manager is None:
            raise EpisodeError(f"{FIELD}: the verl agent loop generated outside an episode")
        return await manager.generate(request_id, **kwargs)
