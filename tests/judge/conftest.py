"""The tiny reward model the judge tests share: built and trained once per session (grpojob.judge.tiny)."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def reward_model(tmp_path_factory) -> Path:
    from grpojob.judge.tiny import build
    return build(tmp_path_factory.mktemp("models") / "reward-model")
