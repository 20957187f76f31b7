"""Fixtures every layer shares: the tiny models, built once per test session (nothing from a hub)."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return build(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return build(tmp_path_factory.mktemp("models") / "tiny-tied", tie_embeddings=True)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_dir))
