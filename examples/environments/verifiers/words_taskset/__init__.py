"""A verifiers v1 (0.4) taskset of one's own (verifiers' public API only; no grpojob import): the
model names words of a category; the reward is the share of its words in it. verifiers imports it
by id (`--env.taskset.id words_taskset`) and plays each task with its default chat program."""
from words_taskset.taskset import WordsTaskset

__all__ = ["WordsTaskset"]
