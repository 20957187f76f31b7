"""An environment written for TRL's `GRPOTrainer(environment_factory=WordsEnv)` (trl >= 1.16), with
no grpojob import: `reset()` starts an episode from a dataset row, public methods are the tools,
`get_reward()` scores the episode from the environment's state."""
from __future__ import annotations

WORDS = {
    "animals": set("cat dog fox owl bee ant cow pig hen elk yak emu bat rat eel cod".split()),
    "colors": set("red blue green gold pink gray black white brown orange purple".split()),
}


class WordsEnv:
    def reset(self, **kwargs) -> str:
        self.category = kwargs.get("answer", "animals")
        self.checked: list[str] = []
        return " ( answer with words )"

    def check_word(self, word: str) -> str:
        """Check whether a word belongs to the category asked for.

        Args:
            word: the word to check
        """
        self.checked.append(word)
        return "yes" if word in WORDS.get(self.category, ()) else "no"

    def get_reward(self) -> float:
        """The share of checked words that belong to the category (0 when none was checked)."""
        hits = [w for w in self.checked if w in WORDS.get(self.category, ())]
        return len(hits) / len(self.checked) if self.checked else 0.0
