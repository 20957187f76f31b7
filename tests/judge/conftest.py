"""The tiny judge models the tests share: built and trained once (grpojob.judge.tiny), then copied from
the per-user cache (grpojob.tiny_cache)."""
from pathlib import Path

import pytest

from grpojob import tiny_cache


@pytest.fixture(scope="session")
def reward_model(tmp_path_factory) -> Path:
    from grpojob.judge.tiny import build
    return tiny_cache.build(build, tmp_path_factory.mktemp("models") / "reward-model")[0]


@pytest.fixture(scope="session")
def generative_judge(tmp_path_factory) -> Path:
    """A tiny chat model taught the rubric of grpojob.judge.tiny (about 10 s on two idle cores)."""
    from grpojob.judge.tiny import build_generative
    return tiny_cache.build(build_generative, tmp_path_factory.mktemp("models") / "generative-judge")[0]
