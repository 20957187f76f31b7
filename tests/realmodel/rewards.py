"""A reward for the real model's mechanics tests: it varies between a group's sampled completions, so
every step has advantages and changes the weights (the learning test scores real tasks instead)."""


def length(prompt, completion, **row) -> float:
    return min(len(completion), 40) / 40
