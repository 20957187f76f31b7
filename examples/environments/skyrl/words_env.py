"""A skyrl-gym environment of one's own (SkyRL's BaseTextEnv, registered by id; no grpojob import):
the model names words of a category; each turn scores the share of its words in it. Two turns:
after the first the environment asks for more."""
from __future__ import annotations

import re

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}


class WordsEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.category = (extras or {})["reward_spec"]["ground_truth"]
        self.max_turns = 2

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        words = re.findall(r"[a-z]+|\d+", action.lower())
        reward = sum(w in WORDS[self.category] for w in words) / len(words) if words else 0.0
        done = self.turns >= self.max_turns
        more = [] if done else [{"role": "user", "content": "more ."}]
        return BaseTextEnvStepOutput(observations=more, reward=reward / self.max_turns, done=done, metadata={})


skyrl_gym.register(id="words", entry_point="words_env:WordsEnv")
