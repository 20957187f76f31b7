"""An Atropos environment (atroposlib's BaseEnv, no grpojob import), run with its own CLI:

    python words_env.py serve --env.rollout_server_url URL --openai.server_type vllm --openai.base_url URL ...

Each item asks for words of a category; a completion scores the share of its words in it. Groups
are sampled through atroposlib's ManagedServer, which keeps the exact tokens and log-probs."""
from __future__ import annotations

import random
import re

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}
TEMPLATES = ("list {c} :", "say some {c} :", "name {c} :", "{c} please :")


def score(text: str, category: str) -> float:
    words = re.findall(r"[a-z]+|\d+", text.lower())
    return sum(w in WORDS[category] for w in words) / len(words) if words else 0.0


class WordsEnv(BaseEnv):
    name = "words"

    @classmethod
    def config_init(cls):
        return (BaseEnvConfig(group_size=8, use_wandb=False, max_token_length=64, batch_size=64,
                              ensure_scores_are_not_same=False, total_steps=1000),
                [APIServerConfig(server_type="vllm", model_name="policy", num_requests_for_eval=0)])

    async def setup(self):
        self.rng = random.Random(0)

    async def get_next_item(self):
        category = self.rng.choice(sorted(WORDS))
        return {"prompt": self.rng.choice(TEMPLATES).format(c=category), "category": category}

    async def collect_trajectories(self, item):
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.completion(prompt=item["prompt"], n=self.config.group_size,
                                                  max_tokens=4, temperature=1.0)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        for choice, node in zip(completion.choices, nodes):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(score(choice.text, item["category"]))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    WordsEnv.cli()
