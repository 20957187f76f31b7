"""TRL's `rollout_func` (trl 1.16: `GRPOTrainer(rollout_func=...)`) as a rollout workflow of ours.

A function written for TRL, `rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids",
"logprobs", ...}`, runs unchanged where its contract fits: name it in a two-line module and point
`rollout.workflow` there:

    # my_workflow.py
    from grpojob.integrations.trl_rollout import rollout_func_workflow
    from my_rollouts import rollout_func
    Workflow = rollout_func_workflow(rollout_func)        # spec.rollout.workflow: my_workflow.py:Workflow

Per group, as TRL's trainer calls it: `prompts` is the row's `prompt` (text or chat messages)
repeated `groupSize` times (TRL's repeat sampler gives `num_generations` copies in a row); the
function returns one completion per entry. It runs in a worker thread (it is synchronous, as in
TRL), so it may block.

What `trainer` offers (a `TrainerView`, not TRL's trainer):
- `processing_class`: the model's tokenizer (apply the chat template with it, as TRL asks);
- `args`: `num_generations`, `max_completion_length`, `temperature`, `top_p`, `top_k`, `min_p`,
  `repetition_penalty`, `generation_kwargs` from the job (`algorithm.groupSize`, `rollout.sampling`);
  `num_generations` also on the view;
- `vllm_generation.vllm_client` (also `vllm_client`): an object with TRL's `VLLMClient.generate`
  signature and return shape (`prompts` as text or token ids, `n`, `max_tokens`, ... ->
  `prompt_ids`, `completion_ids`, `logprobs` `[[lp]]`, `logprob_token_ids`), served by the job's
  policy. Sampling is the job's `rollout.sampling` whatever the call asks (the trainer recomputes
  log-probs at it); `max_tokens` is the smaller of the call's and the job's. Images (`features`)
  and `structured_outputs_regex` are refused.
Not offered: the model, the accelerator, the optimizer, `state` (nothing in a pod is TRL's).

The returned tokens are checked against what the view's client generated: each span of trained
tokens (all of a completion, or the runs where `env_mask` is 1, TRL's mask of the model's own
tokens) must be completions it served, in order; their log-probs and policy versions are the
served ones (a record, never a guess); env tokens (mask 0) are not trained on. A completion that
was not served is refused with the index. Other returned fields (TRL forwards them to reward
functions) are not used: `spec.rewards` score the decoded completions as usual.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, Callable, Optional

from grpojob.integrations import episodes
from grpojob.plugins import Group, Sample, SamplingParams

__all__ = ["RolloutFuncWorkflow", "TrainerView", "rollout_func_workflow"]


class _PolicyClient:
    """TRL's `VLLMClient.generate` over the job's policy; it remembers what it served."""

    def __init__(self, client, loop, tokenizer, sampling: SamplingParams):
        self._client, self._loop, self._tok, self._sampling = client, loop, tokenizer, sampling
        self.served: list[tuple[tuple[int, ...], list[float], list[int]]] = []  # (ids, logprobs, versions)

    def generate(self, prompts, features=None, n: int = 1, repetition_penalty: float = 1.0, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, max_tokens: int = 16,
                 logprobs: Optional[int] = 0, structured_outputs_regex: Optional[str] = None,
                 generation_kwargs: Optional[dict] = None) -> dict[str, list]:
        if features is not None or structured_outputs_regex is not None:
            raise NotImplementedError("vllm_client.generate: images (features) and structured_outputs_regex are not "
                                      "served by grpojob's rollout servers")
        s = SamplingParams(temperature=self._sampling.temperature, top_p=self._sampling.top_p,
                           top_k=self._sampling.top_k, max_tokens=min(int(max_tokens), self._sampling.max_tokens))
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "logprob_token_ids": []}
        for p in prompts:
            ids = list(self._tok(p)["input_ids"]) if isinstance(p, str) else [int(t) for t in p]
            got = asyncio.run_coroutine_threadsafe(self._client.generate(ids, int(n), s), self._loop).result()
            out["prompt_ids"].append(ids)
            for c in got:
                versions = c.versions or [c.policy_version] * len(c.completion_ids)
                self.served.append((tuple(c.completion_ids), list(c.logprobs), list(versions)))
                out["completion_ids"].append(list(c.completion_ids))
                out["logprobs"].append([[lp] for lp in c.logprobs])
                out["logprob_token_ids"].append([[t] for t in c.completion_ids])
        return out

    def span(self, ids: list[int], where: str) -> tuple[list[float], list[int]]:
        """Log-probs and versions of a run of trained tokens: served completions, end to end."""
        lps: list[float] = []
        vers: list[int] = []
        at = 0
        while at < len(ids):
            best = max((s for s in self.served if s[0] and tuple(ids[at:at + len(s[0])]) == s[0]),
                       key=lambda s: len(s[0]), default=None)
            if best is None:
                raise episodes.EpisodeError(f"{where}: tokens {at}.. were not generated by trainer.vllm_client "
                                            "(only completions it served can be trained on: their log-probs and "
                                            "policy versions are recorded)")
            lps += best[1]
            vers += best[2]
            at += len(best[0])
        return lps, vers


class TrainerView:
    """What a rollout_func's `trainer` offers here (see the module's doc)."""

    def __init__(self, tokenizer, group_size: int, sampling: SamplingParams, client: _PolicyClient):
        self.processing_class = tokenizer
        self.num_generations = group_size
        self.args = SimpleNamespace(num_generations=group_size, max_completion_length=sampling.max_tokens,
                                    temperature=sampling.temperature, top_p=sampling.top_p,
                                    top_k=0 if sampling.top_k < 0 else sampling.top_k, min_p=0.0,
                                    repetition_penalty=1.0, generation_kwargs={}, use_vllm=True, vllm_mode="server")
        self.vllm_client = client
        self.vllm_generation = SimpleNamespace(vllm_client=client)


def _floats(row: Any) -> list[float]:
    return [float(v[0] if isinstance(v, (list, tuple)) else v) for v in row]


class RolloutFuncWorkflow:
    """The workflow; `rollout_func_workflow(fn)` makes the class a spec names."""

    rollout_func: Callable[[list, Any], dict]

    def __init__(self, spec, tokenizer):
        self.tokenizer = tokenizer
        self.group_size = spec.algorithm.group_size
        self.sampling = SamplingParams.from_spec(spec.rollout.sampling)

    async def run(self, client, sample: Sample) -> Group:
        prompt = sample.row.get("prompt", sample.prompt)
        served = _PolicyClient(client, asyncio.get_running_loop(), self.tokenizer, self.sampling)
        view = TrainerView(self.tokenizer, self.group_size, self.sampling, served)
        out = await asyncio.to_thread(type(self).rollout_func, [prompt] * self.group_size, view)
        name = getattr(type(self).rollout_func, "__name__", "rollout_func")
        missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - set(out or {}))
        if missing:
            raise ValueError(f"{name} must return keys {missing} in its output dict (TRL's contract)")
        n = len(out["completion_ids"])
        if n != self.group_size or len(out["prompt_ids"]) != n or len(out["logprobs"]) != n:
            raise ValueError(f"{name} returned {len(out['prompt_ids'])} prompt_ids, {n} completion_ids and "
                             f"{len(out['logprobs'])} logprobs for {self.group_size} prompts: one each "
                             "(algorithm.groupSize copies of the row's prompt)")
        masks = out.get("env_mask")
        eps = []
        for i in range(n):
            ids = [int(t) for t in out["completion_ids"][i]]
            mask = [int(m) for m in masks[i]] if masks is not None else [1] * len(ids)
            if len(mask) != len(ids) or len(_floats(out["logprobs"][i])) != len(ids):
                raise episodes.EpisodeError(f"{name}: completion {i} has {len(ids)} tokens, "
                                            f"{len(_floats(out['logprobs'][i]))} logprobs, {len(mask)} env_mask entries")
            lps, vers = [0.0] * len(ids), [-1] * len(ids)
            start = None
            for j, m in enumerate(mask + [0]):
                if m and start is None:
                    start = j
                elif not m and start is not None:
                    lps[start:j], vers[start:j] = served.span(ids[start:j], f"{name}: completion {i}")
                    start = None
            eps.append(episodes.Episode(prompt_ids=[int(t) for t in out["prompt_ids"][i]], completion_ids=ids,
                                        logprobs=lps, loss_mask=mask, versions=vers))
        return episodes.to_group(sample, eps, self.tokenizer)


def rollout_func_workflow(rollout_func: Callable[[list, Any], dict]) -> type:
    """A workflow class (spec.rollout.workflow) that runs TRL's `rollout_func(prompts, trainer)`."""
    if not callable(rollout_func):
        raise TypeError(f"rollout_func_workflow: {rollout_func!r} is not callable (TRL's rollout_func: "
                        "(prompts, trainer) -> dict)")
    name = f"{getattr(rollout_func, '__name__', 'rollout_func')}_workflow"
    return type(name, (RolloutFuncWorkflow,), {"rollout_func": staticmethod(rollout_func)})
