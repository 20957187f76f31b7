"""An ART training script (openpipe-art 0.5), written as ART's docs write one: a rollout function
over the model's OpenAI client returning an `art.Trajectory`, groups gathered with
`art.gather_trajectory_groups`, `backend.train(...)` and `model.log(...)` each step.

The one line changed for grpojob is the backend's import (marked below): `GRPOJobBackend` takes
the place of ART's `LocalBackend`, so the script trains the GRPOJob it runs in (words.yaml, where
it is the job's environment). Each prompt asks for words of a category; a completion's reward is
the share of its words that are in it (the toy task a tiny random model can learn).
"""
import asyncio
import os
import random
import re

import art
from grpojob.integrations.art import GRPOJobBackend as LocalBackend  # the one change: was `from art.local import LocalBackend`

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}
TEMPLATES = ("list {c} :", "say some {c} :", "name {c} :", "{c} please :")
STEPS = int(os.environ.get("ART_STEPS", "40"))
GROUPS_PER_STEP = int(os.environ.get("ART_GROUPS_PER_STEP", "8"))
ROLLOUTS_PER_GROUP = int(os.environ.get("ART_ROLLOUTS_PER_GROUP", "8"))
LEARNING_RATE = float(os.environ.get("ART_LEARNING_RATE", "0.003"))


def score(text: str, category: str) -> float:
    words = re.findall(r"[a-z]+|\d+", text.lower())
    return sum(w in WORDS[category] for w in words) / len(words) if words else 0.0


async def rollout(model: art.TrainableModel, scenario: dict) -> art.Trajectory:
    client = model.openai_client()
    messages = [{"role": "user", "content": scenario["prompt"]}]
    completion = await client.chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_completion_tokens=4)
    choice = completion.choices[0]
    reward = score(choice.message.content or "", scenario["category"])
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=reward,
                          metrics={"has_word": float(reward > 0)})


async def main() -> None:
    random.seed(0)
    backend = LocalBackend()
    model = art.TrainableModel(name="words-001", project="grpojob-art", base_model="tiny")
    await model.register(backend)
    for step in range(await model.get_step(), STEPS):
        scenarios = []
        for _ in range(GROUPS_PER_STEP):
            category = random.choice(sorted(WORDS))
            scenarios.append({"prompt": random.choice(TEMPLATES).format(c=category), "category": category})
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(ROLLOUTS_PER_GROUP)) for s in scenarios),
            pbar_desc=f"step {step}", max_exceptions=ROLLOUTS_PER_GROUP * GROUPS_PER_STEP)
        result = await backend.train(model, groups, learning_rate=LEARNING_RATE)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        print(f"step {result.step}: reward {sum(t.reward for g in groups for t in g.trajectories) / sum(len(g.trajectories) for g in groups):.3f}", flush=True)
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
