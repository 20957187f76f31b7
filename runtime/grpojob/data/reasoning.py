"""reasoning-gym (https://github.com/open-thought/reasoning-gym) as a built-in dataset and reward.

The dataset `reasoning-gym` draws items from one task or a weighted mix (reasoning-gym's own
CompositeDataset: its per-index weighted draw and its per-task seeds), each prompt the question under
one of reasoning-gym's system prompts (SYSTEM_PROMPTS, which ask for the answer in <answer> tags).
The reward `reasoning-gym` extracts the answer as that prompt asks (reasoning_gym.utils.extract_answer)
and scores it with the task's own `score_answer`.

Splits: a question belongs to the held-out `test` split when the hash of its task and text falls in
the lowest HELD_OUT share, else to `train`; each split keeps only its own questions. So the two are
disjoint whatever their sizes and seeds, even for a task with few distinct questions.

The package is an optional dependency (the `reasoning-gym` extra), imported only when a spec names it.
"""
from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Iterator, Literal, Optional

HELD_OUT = 0.1  # share of every task's questions kept for the test split
_TASK_KEYS = ("name", "weight", "config")
OPEN, CLOSE = "<answer>", "</answer>"  # what prefill starts the reply with; what ends the answer
_TRIES = 50  # candidates drawn per item wanted (the test split keeps about 1 in 10) before giving up
INSTALL = "pip install 'grpojob[reasoning-gym]' (the reasoning-gym package)"


class ReasoningGymError(ValueError):
    """Args that cannot make a dataset: (sub-path under args, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(f"args{p}: {m}" for p, m in problems))
        self.problems = problems


def _rg():
    try:
        import reasoning_gym
        import reasoning_gym.composite
        import reasoning_gym.utils
    except ImportError:
        raise ReasoningGymError([("", f"the reasoning-gym dataset needs the reasoning-gym package: {INSTALL}")]) \
            from None
    return reasoning_gym


def held_out(task: str, question: str) -> bool:
    """Whether a question is in the test split (a stable hash, not Python's salted one)."""
    digest = hashlib.sha256(f"{task}\0{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < HELD_OUT * 2 ** 64


def check_args(tasks: Any = None, size: Any = 1000, seed: Any = 0, split: Any = "train",
               system_prompt: Any = "default", prefill: Any = False) -> list[tuple[str, str]]:
    """Every problem of these args (sub-path under args, message): task names reasoning-gym lacks,
    configs its task refuses, tasks without a scorable answer (one item is generated and its
    reference answer scored), an unknown system prompt. [] when the dataset can be made."""
    if not isinstance(tasks, list) or not tasks:
        return [(".tasks", "must be a non-empty list of {name, weight, config}, e.g. [{name: chain_sum}]")]
    try:
        rg = _rg()
    except ReasoningGymError as e:
        return e.problems
    out: list[tuple[str, str]] = []
    if system_prompt not in rg.utils.SYSTEM_PROMPTS:
        out.append((".system_prompt", f"'{system_prompt}' is not one of reasoning-gym's system prompts: use one of "
                    f"{', '.join(rg.utils.SYSTEM_PROMPTS)}"))
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        out.append((".size", f"must be a positive integer, not {size!r}"))
    if not isinstance(prefill, bool):
        out.append((".prefill", f"must be true or false, not {prefill!r}"))
    if split not in ("train", "test"):
        out.append((".split", f"must be train or test, not {split!r}"))
    names = []
    for i, t in enumerate(tasks):
        out += _task_problems(rg, f".tasks[{i}]", t)
        names.append(t.get("name") if isinstance(t, dict) else None)
    dup = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dup:
        out.append((".tasks", f"names {', '.join(map(str, dup))} more than once: give each task once, with its weight"))
    return out


def _task_problems(rg: Any, where: str, task: Any) -> list[tuple[str, str]]:
    if not isinstance(task, dict):
        return [(where, "must be an object {name, weight, config}")]
    out = [(f"{where}.{k}", f"unknown key: a task takes {', '.join(_TASK_KEYS)}") for k in task if k not in _TASK_KEYS]
    name, weight, config = task.get("name"), task.get("weight", 1), task.get("config", {})
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
        out.append((f"{where}.weight", f"must be a positive number, not {weight!r}"))
    if not isinstance(config, dict):
        return out + [(f"{where}.config", f"must be an object of the task's settings, not {config!r}")]
    if not isinstance(name, str) or name not in rg.factory.DATASETS or name == "composite":
        return out + [(f"{where}.name", f"{name!r} is not a reasoning-gym task: use one of "
                       f"{', '.join(sorted(rg.factory.DATASETS))}")]
    bad = [k for k in ("seed", "size") if k in config]
    if bad:
        return out + [(f"{where}.config.{bad[0]}", "is set by the dataset's own size and seed (args.size, args.seed)")]
    try:
        ds = rg.create_dataset(name, size=1, seed=0, **config)
        entry = ds[0]
    except Exception as e:  # noqa: BLE001 - the task's own refusal, said with the field
        return out + [(f"{where}.config", f"reasoning-gym's {name} refuses it: {type(e).__name__}: {e}")]
    answer = entry.get("answer")
    if not isinstance(answer, str) or not answer:
        return out + [(f"{where}.name", f"{name}'s items have no reference answer ({answer!r}): it cannot be "
                       "scored; pick a task whose items carry an answer")]
    if ds.score_answer(answer, entry) < 1.0:
        out.append((f"{where}.name", f"{name} does not give its own reference answer full marks "
                    f"(score_answer {ds.score_answer(answer, entry)}): it cannot be scored reliably"))
    return out


def reasoning_gym(tasks: list[dict], size: int = 1000, seed: int = 0, split: Literal["train", "test"] = "train",
                  system_prompt: str = "default", prefill: bool = False) -> Iterator[dict[str, Any]]:
    """`size` items of the split, from one task or a weighted mix: tasks [{name, weight (default 1),
    config (the task's settings)}]. Rows: prompt (the system prompt and the question, for a plain
    prompt), messages (system and user, rendered with the chat template when spec.model.useChatTemplate),
    question, answer, metadata (the item's own), task_config (for scoring), prefill.
    prefill: the reply starts with `<answer>` (the prompt ends with it), for a small model that does
    not follow the system prompt's format yet; the answer is then what the model writes up to
    `</answer>` or the reply's end (the task's score_answer gives a long reply partial credit)."""
    problems = check_args(tasks, size, seed, split, system_prompt, prefill)
    if problems:
        raise ReasoningGymError(problems)
    rg = _rg()
    specs = [rg.composite.DatasetSpec(name=t["name"], weight=float(t.get("weight", 1)), config=dict(t.get("config", {})))
             for t in tasks]
    configs = {t["name"]: dict(t.get("config", {})) for t in tasks}
    bound = size * _TRIES + 100
    mix = rg.create_dataset("composite", size=bound, seed=seed, datasets=specs)
    system = rg.utils.SYSTEM_PROMPTS[system_prompt]
    kept, test, opened = 0, split == "test", OPEN if prefill else ""
    for idx in range(bound):
        if kept == size:
            return
        entry = mix[idx]
        task = entry["metadata"]["source_dataset"]
        if held_out(task, entry["question"]) != test:
            continue
        kept += 1
        yield {"prompt": f"{system}\n{entry['question']}\n{opened}" if opened else f"{system}\n{entry['question']}",
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": entry["question"]}],
               "question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"],
               "task_config": configs[task], "prefill": opened}
    raise ReasoningGymError([(".size", f"the {split} split of these tasks gave only {kept} items in {bound} draws: "
                              "a task with few distinct questions has few (or none) in a split; widen its config")])


@functools.lru_cache(maxsize=64)
def _scorer(task: str, config_json: str) -> Any:
    return _rg().create_dataset(task, size=1, seed=0, **json.loads(config_json))


def score(completion: str, question: Any = None, answer: Any = None, metadata: Optional[dict] = None,
          task_config: Optional[dict] = None, prefill: str = "") -> float:
    """The task's score_answer of the reply's <answer>...</answer> (None when absent: the task
    decides, usually 0). 0 for a row that is not a reasoning-gym item."""
    if not isinstance(metadata, dict) or "source_dataset" not in metadata:
        return 0.0
    rg = _rg()
    ds = _scorer(metadata["source_dataset"], json.dumps(task_config or {}, sort_keys=True))
    got = rg.utils.extract_answer(_reply(completion, prefill), "answer")
    return float(ds.score_answer(got, {"question": question, "answer": answer, "metadata": metadata}))


def answer_format(completion: str, prefill: str = "") -> float:
    """1.0 when the reply (prefill, completion) gives an answer in <answer>...</answer> tags, as the
    system prompt asks."""
    return 1.0 if _rg().utils.extract_answer(prefill + completion, "answer") is not None else 0.0


def _reply(completion: str, prefill: str) -> str:
    """The reply as the answer tag sees it: with a prefill the prompt opened the tag, so the
    answer is what follows, up to </answer> or the reply's end."""
    if prefill and CLOSE not in completion:
        return prefill + completion + CLOSE
    return prefill + completion
