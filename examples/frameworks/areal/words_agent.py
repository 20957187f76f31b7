"""An AReaL agent workflow of one's own, written as AReaL's own agents are
(`areal/workflow/openai/math_agent.py`: a plain class with `async def run(self, data, **extra_kwargs)`,
an `AsyncOpenAI` built from the `base_url`, `api_key` and `http_client` AReaL passes, the reward
through AReaL's `AsyncRewardWrapper`). No grpojob import: it runs unchanged under AReaL's trainer
and here, over our agent sessions (grpojob.integrations.areal_agent).

The model names words of a category in two turns: after its first answer the agent asks for more
(a user turn, masked out of training). `WordsAgent.run` returns one float, the mean share of the
category's words over both answers (AReaL's set_last_reward); `WordsTurnsAgent.run` returns a dict
{completion id: that answer's share}, as AReaL's `MultiTurnMathAgent` does.

    python -m grpojob.integrations.areal_agent --agent words_agent.py:WordsAgent --data words.jsonl
"""
import os
import re

from openai import AsyncOpenAI

from areal.api import AsyncRewardWrapper

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}


def words_reward(completions: str, answer: str) -> float:
    words = re.findall(r"[a-z]+|\d+", (completions or "").lower())
    return sum(w in WORDS[answer] for w in words) / len(words) if words else 0.0


class WordsTurnsAgent:
    def __init__(self, max_turns: int = 2, **kwargs):
        self.max_turns = max_turns
        self.kwargs = kwargs.copy()  # forwarded to chat.completions.create, as AReaL's agents do
        self._reward_fn = AsyncRewardWrapper(words_reward)

    async def run(self, data: dict, **extra_kwargs):
        http_client = extra_kwargs.get("http_client", None)
        base_url = extra_kwargs.get("base_url", None) or os.getenv("OPENAI_BASE_URL")
        api_key = extra_kwargs.get("api_key", None) or os.getenv("OPENAI_API_KEY")
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages = data["messages"].copy()
        rewards = {}
        for turn in range(self.max_turns):
            response = await client.chat.completions.create(messages=messages, model="default", **self.kwargs)
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            rewards[response.id] = await self._reward_fn(completions=message.content, answer=data["answer"])
            if turn < self.max_turns - 1:
                messages.append({"role": "user", "content": "more ."})
        return rewards


class WordsAgent(WordsTurnsAgent):
    async def run(self, data: dict, **extra_kwargs):
        rewards = await super().run(data, **extra_kwargs)
        return sum(rewards.values()) / len(rewards)
