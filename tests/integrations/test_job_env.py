"""The environment drivers' shared pacing (grpojob.integrations.job_env.play_groups): `--concurrency`
groups in flight at once as workers (a slow group holds up only its own), every group played once, a
failed one played again, any other error ending the driver."""
from __future__ import annotations

import asyncio

import pytest

from grpojob.integrations import job_env


class Flaky(RuntimeError):
    pass


def run(play, **kw):
    return asyncio.run(job_env.play_groups(play, http=None, trajectories=None, retry_s=0.01, **kw))


def test_groups_run_concurrency_at_a_time_as_workers_and_each_once():
    live, peak, played = 0, 0, []

    async def play(i):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.2 if i == 0 else 0.01)  # group 0 is slow: the other workers go on meanwhile
        played.append(i)
        live -= 1

    assert run(play, groups=9, concurrency=3, errors=(Flaky,)) == 9
    assert peak == 3 and sorted(played) == list(range(9))
    assert played[-1] == 0  # the slow one finished last: no batch waited for it


def test_a_failed_group_is_played_again_and_another_error_ends_the_driver():
    tries: dict[int, int] = {}

    async def play(i):
        tries[i] = tries.get(i, 0) + 1
        if i == 2 and tries[i] == 1:
            raise Flaky("the rollout server restarted")

    assert run(play, groups=4, concurrency=2, errors=(Flaky,)) == 4
    assert tries == {0: 1, 1: 1, 2: 2, 3: 1}

    async def broken(i):
        raise KeyError("a bug in the user's environment")

    with pytest.raises(KeyError):
        run(broken, groups=4, concurrency=2, errors=(Flaky,))
    with pytest.raises(SystemExit, match="--concurrency 0"):
        run(broken, groups=1, concurrency=0, errors=(Flaky,))
