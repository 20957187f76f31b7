"""Built-in reward functions: (prompt, completion, **row) -> float. Pure Python, no torch."""
from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Any, Optional

from grpojob.data import reasoning
from grpojob.data.builtin import TOY_CATEGORIES

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: Optional[str]) -> Optional[float]:
    if text is None:
        return None
    m = _NUM.findall(text.replace("$", ""))
    if not m:
        return None
    try:
        return float(m[-1].replace(",", ""))
    except ValueError:
        return None


def _boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a completion: \\boxed{...}, else what follows the last '####'."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n")[0]
    return None


def math_exact(prompt: str, completion: str, answer: Any = None, **_: Any) -> float:
    """1.0 when the completion's final answer (\\boxed{} or #### n) equals the reference number.
    The reference may itself be a GSM8K solution ending in '#### n'."""
    ref = str(answer) if answer is not None else ""
    ref_value = _number(extract_answer(ref) or ref)
    got = _number(extract_answer(completion))
    if ref_value is None or got is None:
        return 0.0
    return 1.0 if abs(got - ref_value) < 1e-6 * max(1.0, abs(ref_value)) else 0.0


_THINK = re.compile(r"<think>.*?</think>", re.S)
_ANSWER = re.compile(r"<answer>.*?</answer>|\\boxed\{|####", re.S)


def format(prompt: str, completion: str, pattern: Optional[str] = None, **_: Any) -> float:  # noqa: A001
    """With `pattern`: 1.0 if the completion matches it (re.search, DOTALL). Otherwise reasoning
    format: 0.5 for a <think>...</think> block, 0.5 for a final answer marker after it."""
    if pattern:
        return 1.0 if re.search(pattern, completion, re.S) else 0.0
    think = _THINK.search(completion)
    rest = completion[think.end():] if think else completion
    return 0.5 * bool(think) + 0.5 * bool(_ANSWER.search(rest))


def _normalise(text: str) -> str:
    return " ".join(text.strip().lower().rstrip(".!?").split())


def exact_match(prompt: str, completion: str, answer: Any = None, prefix: bool = False, **_: Any) -> float:
    """1.0 when the completion equals the answer (case and whitespace normalised); with
    prefix=true, when it starts with the answer as whole words."""
    got, ref = _normalise(completion), _normalise(str(answer if answer is not None else ""))
    if not ref:
        return 0.0
    if prefix:
        return 1.0 if got == ref or got.startswith(ref + " ") else 0.0
    return 1.0 if got == ref else 0.0


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div,
            ast.USub, ast.UAdd)


def _safe_eval(expr: str) -> Optional[float]:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None
    if not all(isinstance(n, _ALLOWED) for n in ast.walk(tree)):
        return None
    try:
        return float(eval(compile(tree, "<countdown>", "eval"), {"__builtins__": {}}))  # noqa: S307 - AST-checked
    except (ZeroDivisionError, OverflowError, ValueError):
        return None


def countdown(prompt: str, completion: str, numbers: Any = None, target: Any = None,
              format_score: float = 0.1, **_: Any) -> float:
    """Countdown: an arithmetic expression in <answer>...</answer> using each given number at most
    once that evaluates to the target: 1.0; a well-formed but wrong answer: format_score."""
    m = _ANSWER_TAG.findall(completion)
    if not m or numbers is None or target is None:
        return 0.0
    expr = m[-1].strip()
    if not re.fullmatch(r"[\d+\-*/().\s]+", expr):
        return 0.0
    used = Counter(int(x) for x in re.findall(r"\d+", expr))
    if used - Counter(int(n) for n in numbers):
        return format_score
    value = _safe_eval(expr)
    if value is None:
        return format_score
    return 1.0 if abs(value - float(target)) < 1e-6 else format_score


_WORD = re.compile(r"[a-z]+|\d+")


def toy(prompt: str, completion: str, answer: Any = None, **_: Any) -> float:
    """Share of the completion's words that belong to the category named by `answer`."""
    words = _WORD.findall(completion.lower())
    if not words or answer not in TOY_CATEGORIES:
        return 0.0
    members = TOY_CATEGORIES[answer]
    hits = sum(w.isdigit() if members is None else w in members for w in words)
    return hits / len(words)


def reasoning_gym(prompt: str, completion: str, question: Any = None, answer: Any = None, metadata: Any = None,
                  task_config: Any = None, prefill: str = "", **_: Any) -> float:
    """A reasoning-gym item's score: its task's score_answer of the completion's <answer>...</answer>
    (grpojob.data.reasoning); 0 for a row that is not a reasoning-gym item."""
    return reasoning.score(completion, question, answer, metadata, task_config, prefill or "")


def reasoning_gym_format(prompt: str, completion: str, prefill: str = "", **_: Any) -> float:
    """1.0 when the completion puts an answer in <answer>...</answer>, as reasoning-gym's system prompts ask."""
    return reasoning.answer_format(completion, prefill or "")


REWARDS = {"math_exact": math_exact, "format": format, "countdown": countdown,
           "exact_match": exact_match, "toy": toy, "reasoning-gym": reasoning_gym,
           "reasoning-gym-format": reasoning_gym_format}
