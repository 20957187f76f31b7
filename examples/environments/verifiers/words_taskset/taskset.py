import re

import verifiers.v1 as vf

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}


class WordsData(vf.TaskData):
    category: str = "animals"


class WordsTask(vf.Task[WordsData]):
    @vf.reward(weight=1.0)
    async def in_category(self, trace: vf.Trace) -> float:
        words = re.findall(r"[a-z]+|\d+", trace.last_reply.lower())
        return sum(w in WORDS[self.data.category] for w in words) / len(words) if words else 0.0


class WordsConfig(vf.TasksetConfig):
    num_tasks: int = 8
    """How many tasks to build (the categories in turn)."""


class WordsTaskset(vf.Taskset[WordsTask, WordsConfig]):
    def load(self) -> list[WordsTask]:
        names = sorted(WORDS)
        return [WordsTask(WordsData(prompt=f"name {names[i % len(names)]} .", category=names[i % len(names)]),
                          self.config.task) for i in range(self.config.num_tasks)]
