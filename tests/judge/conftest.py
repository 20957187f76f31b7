"""The tiny judge models the tests share: built and trained once per session (grpojob.judge.tiny)."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def reward_model(tmp_path_factory) -> Path:
    from grpojob.judge.tiny import build
    return build(tmp_path_factory.mktemp("models") / "reward-model")


@pytest.fixture(scope="session")
def generative_judge(tmp_path_factory) -> Path:
    """A tiny chat model taught the rubric of grpojob.judge.tiny (about 10 s on two idle cores)."""
    from grpojob.judge.tiny import build_generative
    return build_generative(tmp_path_factory.mktemp("models") / "generative-judge")
