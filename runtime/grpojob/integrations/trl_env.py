"""TRL's `environment_factory` environments (trl >= 1.16) as a rollout workflow of ours.

An environment class written for `GRPOTrainer(environment_factory=MyEnv)` runs unchanged: name it
in a two-line module and point `rollout.workflow` there:

    # my_workflow.py
    from grpojob.integrations.trl_env import environment_workflow
    from my_env import MyEnv
    Workflow = environment_workflow(MyEnv)          # spec.rollout.workflow: my_workflow.py:Workflow

What it does per completion of a group, as TRL's trainer does per rollout:
- `env = factory()`, then `env.reset(**row)` with the dataset row's fields; a string it returns is
  appended to the last user message (the row's `prompt`: a list of chat messages, or a text taken
  as one user message);
- the public methods (not `reset`, `get_reward`, `_...`) are the tools: their JSON schemas
  (transformers' `get_json_schema`, from type hints and docstrings, as TRL builds them) go through
  the model's chat template;
- the policy answers; each Hermes tool call (`<tool_call>{"name", "arguments"}</tool_call>`) calls
  the method (an exception becomes `{"error": ...}`), the tool messages are rendered as TRL renders
  them (the template's suffix after a dummy assistant turn) and the policy answers again, up to
  `max_turns` answers or until prompt + next answer would exceed the job's context length;
- the reward, as in TRL, sums its sources: the job's `spec.rewards` (TRL's reward_funcs; they
  score the LAST answer's text) and `env.get_reward()` (sync or async, weight 1) when the class
  has one; either may be absent.

The trainer gets exact tokens: the policy's own (loss mask 1, their log-probs and versions) and
the tool messages' (mask 0), through grpojob.integrations.episodes.

Differences from TRL's trainer: one fresh environment per completion (TRL reuses a pool of
instances, resetting them); metrics.jsonl's reward parts are `spec.rewards`' (get_reward's share
is in the total only); spec.rewards see the last answer, not the whole conversation; only the Hermes tool-call format is parsed (TRL uses the tokenizer's
response schema).
"""
from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any, Callable, Optional

from grpojob.integrations import episodes
from grpojob.plugins import Group, RewardScorer, Sample, SamplingParams

__all__ = ["EnvironmentWorkflow", "environment_workflow"]

_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_RESERVED = ("reset", "get_reward")


def tool_methods(env: Any) -> list[Callable]:
    """The environment's tools, as TRL finds them: public functions of its class but reset/get_reward."""
    return [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in _RESERVED and not name.startswith("_")]


def parse_calls(text: str) -> list[tuple[str, dict]]:
    """Hermes tool calls in a reply: [(name, arguments)]; a block that is not a call is skipped."""
    out = []
    for block in _CALL.findall(text):
        try:
            doc = json.loads(block)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("name"), str):
            args = doc.get("arguments") or {}
            out.append((doc["name"], args if isinstance(args, dict) else {}))
    return out


async def call_tool(tools: dict[str, Callable], name: str, args: dict) -> Any:
    """A tool's result; failures become {"error": ...} as in TRL's tool loop."""
    try:
        fn = tools[name]
    except KeyError:
        return {"error": f"Tool {name} not found."}
    try:
        result = fn(**args)
        return await result if inspect.isawaitable(result) else result
    except Exception as e:  # noqa: BLE001 - the model's bad call is the model's to learn from
        return {"error": str(e)}


def messages_of(row: dict, observation: Any) -> list[dict]:
    """The row's prompt as chat messages, with reset()'s observation appended to the last one."""
    prompt = row.get("prompt", "")
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if isinstance(observation, str) and messages:
        messages[-1]["content"] = str(messages[-1].get("content") or "") + observation
    return messages


class EnvironmentWorkflow:
    """The workflow; `environment_workflow(factory)` makes the class a spec names."""

    factory: Callable[[], Any]
    max_turns: int = 4

    def __init__(self, spec, tokenizer):
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{type(self).__name__}: the model's tokenizer has no chat template: TRL environments "
                             "are chat conversations (give spec.model a tokenizer with a chat_template)")
        self.tokenizer = tokenizer
        self.group_size = spec.algorithm.group_size
        self.sampling = SamplingParams.from_spec(spec.rollout.sampling)
        self.limit = min(spec.context_length, spec.training.micro_batch_tokens)
        self.scorer = RewardScorer(spec, tokenizer) if spec.rewards else None  # TRL's reward_funcs

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, messages: list[dict], tools: Optional[list], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation,
                                                  tokenize=False)

    def tool_suffix(self, tool_messages: list[dict]) -> list[int]:
        """The tokens of tool messages and the next assistant header, as TRL computes them."""
        dummy = [{"role": "user", "content": "dummy"},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
        prefix = self._render(dummy, None, False)
        full = self._render(dummy + tool_messages, None, True)
        return self._encode(full[len(prefix):])

    async def run(self, client, sample: Sample) -> Group:
        eps = await asyncio.gather(*(self.episode(client, sample) for _ in range(self.group_size)))
        group = episodes.to_group(sample, eps, self.tokenizer)
        own = [c.reward for c in group.completions]
        if self.scorer is not None and any(r is not None for r in own):
            # get_reward and spec.rewards both: their sum (TRL's), so the trainer does not score again
            for c in group.completions:
                c.reward = None
            await self.scorer.score_group(group)
            for c, mine, theirs in zip(group.completions, own, group.rewards):
                c.reward = theirs + (mine or 0.0)
        return group

    async def episode(self, client, sample: Sample) -> episodes.Episode:
        from transformers.utils import get_json_schema

        env = type(self).factory()
        observation = env.reset(**sample.row)
        methods = tool_methods(env)
        schemas = [get_json_schema(m) for m in methods]
        tools = {m.__name__: m for m in methods}
        prompt = self._encode(self._render(messages_of(sample.row, observation), schemas, True))
        ids: list[int] = []
        lps: list[float] = []
        mask: list[int] = []
        versions: list[int] = []
        text, finish = "", "stop"
        for turn in range(self.max_turns):
            c = (await client.generate(prompt + ids, 1, self.sampling))[0]
            ids += c.completion_ids
            lps += c.logprobs
            mask += [1] * len(c.completion_ids)
            versions += c.versions or [c.policy_version] * len(c.completion_ids)
            text, finish = c.text or self.tokenizer.decode(c.completion_ids, skip_special_tokens=True), c.finish_reason
            calls = parse_calls(text) if tools else []
            if not calls or turn == self.max_turns - 1:
                break
            results = [await call_tool(tools, name, args) for name, args in calls]
            suffix = self.tool_suffix([{"role": "tool", "name": name, "content": str(r)}
                                       for (name, _), r in zip(calls, results)])
            if len(prompt) + len(ids) + len(suffix) + self.sampling.max_tokens > self.limit:
                break  # TRL drops a tool result that would overflow and ends the rollout
            ids += suffix
            lps += [0.0] * len(suffix)
            mask += [0] * len(suffix)
            versions += [versions[-1]] * len(suffix)
        reward = None
        if callable(getattr(env, "get_reward", None)):
            reward = env.get_reward()
            reward = float(await reward if inspect.isawaitable(reward) else reward)
        return episodes.Episode(prompt_ids=prompt, completion_ids=ids, logprobs=lps, loss_mask=mask,
                                versions=versions, reward=reward, finish_reason=finish, text=text)


def environment_workflow(factory: Callable[[], Any], *, max_turns: int = 4) -> type:
    """A workflow class (spec.rollout.workflow) that plays `factory`'s environments (TRL's shape)."""
    if not callable(factory):
        raise TypeError(f"environment_workflow: {factory!r} is not callable (TRL's environment_factory: a class "
                        "or a function returning an environment)")
    probe = factory()
    if not callable(getattr(probe, "reset", None)):
        raise TypeError(f"environment_workflow: {getattr(factory, '__name__', factory)}'s environments have no "
                        "reset(): TRL's environment_factory needs a callable reset")
    name = f"{getattr(factory, '__name__', 'Environment')}Workflow"
    return type(name, (EnvironmentWorkflow,), {"factory": staticmethod(factory), "max_turns": max_turns})
