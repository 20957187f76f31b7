"""The example environments' scoring (examples/environments): a completion is whatever a policy
sampled, so any character may come; a number is read only from decimal digits. CI, this stop: a
tiny model sampled '⑨' (a digit to str.isdigit, not to int()) and the calculator agent crashed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / "environments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("answer, correct", [("⑨", 0.0), ("² 9", 1.0), ("it is 9", 1.0), ("٩", 1.0), ("-9", 0.0)])
def test_the_calculator_scores_any_sampled_text_without_crashing(answer, correct):
    assert _example("calculator").score(True, True, answer, 9)["correct"] == correct


@pytest.mark.parametrize("text, correct", [("⑨", 0.0), ("① 9", 1.0), ("9", 1.0)])
def test_the_arithmetic_environment_scores_any_sampled_text_without_crashing(text, correct):
    assert _example("arithmetic").score(text, 9)["correct"] == correct
