"""Workflows (built-in and plug-in) and the RolloutManager's staleness rules, with a real
in-process generator (hf_generate on the tiny model)."""
from __future__ import annotations

import threading
import time

import pytest

from grpojob.api import plugins
from grpojob.rollout import workflows
from grpojob.rollout.client import RolloutError
from grpojob.rollout.manager import RolloutManager
from grpojob.rollout.types import Sample

from .harness import load_model, make_job, wait_for
from .inprocess import ModelGenerator

GROUP = 3


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture
def gen(model, tokenizer):
    return ModelGenerator(model, tokenizer)


def _spec(tiny_dir, workflow="single-turn"):
    return make_job(tiny_dir, algorithm={"groupSize": GROUP},
                    rollout={"workflow": workflow, "sampling": {"maxTokens": 4}}).spec


def _samples(tokenizer, n=1000):
    for i in range(n):
        text = f"{i} + {i} ="
        yield Sample(index=i, prompt=text, prompt_ids=tokenizer.encode(text), row={"answer": str(2 * i)})


def test_registry_is_exactly_the_api_builtins(tiny_dir, tokenizer):
    assert tuple(workflows.WORKFLOWS) == plugins.BUILTIN_WORKFLOWS
    for name in plugins.BUILTIN_WORKFLOWS:
        assert isinstance(workflows.build(_spec(tiny_dir, name), tokenizer), workflows.WORKFLOWS[name])


def test_bad_plugins_are_named(tiny_dir, tokenizer):
    with pytest.raises(ValueError, match="rollout.workflow 'nope.mod:Wf': cannot import module 'nope.mod'"):
        workflows.build(_spec(tiny_dir, "nope.mod:Wf"), tokenizer)
    with pytest.raises(ValueError, match="no `async def run"):
        workflows.build(_spec(tiny_dir, "tests.rollout.plugin_workflows:NoRun"), tokenizer)


def test_single_turn_and_greedy_baseline(tiny_dir, tokenizer, gen):
    import asyncio

    sample = next(_samples(tokenizer))
    group = asyncio.run(workflows.build(_spec(tiny_dir), tokenizer).run(gen, sample))
    assert len(group.completions) == GROUP and group.baseline is None
    assert all(c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in group.completions)

    group = asyncio.run(workflows.build(_spec(tiny_dir, "greedy-baseline"), tokenizer).run(gen, sample))
    assert len(group.completions) == GROUP
    greedy_calls = [c for c in gen.calls if c["sampling"].temperature == 0]
    assert len(greedy_calls) == 1 and greedy_calls[0]["n"] == 1
    from .harness import greedy
    assert group.baseline.completion_ids == greedy(gen.model, tokenizer, sample.prompt_ids, 4)[0]


def test_a_multi_turn_plugin_masks_tool_tokens_and_scores_itself(tiny_dir, tokenizer, gen):
    wf = workflows.build(_spec(tiny_dir, "tests.rollout.plugin_workflows:TwoTurnTool"), tokenizer)
    with RolloutManager(gen, wf, _samples(tokenizer)) as m:
        groups = m.next_groups(2)
    assert len(groups) == 2
    for g in groups:
        for c in g.completions:
            assert len(c.loss_mask) == len(c.completion_ids) == len(c.logprobs)
            tool = [i for i, bit in enumerate(c.loss_mask) if bit == 0]
            assert [c.completion_ids[i] for i in tool] == wf.TOOL_REPLY
            assert 0.0 <= c.reward <= 1.0
    assert len(gen.calls) == 2 * (1 + GROUP)  # one first turn per group, one second turn per completion


def test_on_policy_generates_on_demand_at_the_current_version(tiny_dir, tokenizer, gen):
    wf = workflows.build(_spec(tiny_dir), tokenizer)
    with RolloutManager(gen, wf, _samples(tokenizer), max_staleness=0) as m:
        groups = m.next_groups(3)
        assert [g.sample.index for g in groups] == [0, 1, 2]
        assert {c.policy_version for g in groups for c in g.completions} == {0}
        time.sleep(0.3)
        assert len(gen.calls) == 3  # nothing generated ahead

        # The trainer moves to version 2 before the generator has the weights: the manager asks
        # for at least version 2, so it waits for the (lagging) generator instead of using v0/v1.
        gen.version = 1
        threading.Timer(0.3, lambda: setattr(gen, "version", 2)).start()
        groups = m.next_groups(3, policy_version=2)
        assert {c.policy_version for g in groups for c in g.completions} == {2}
        assert all(c["min_version"] == 2 for c in gen.calls[3:])


def test_staleness_bound_with_generation_running_ahead(tiny_dir, tokenizer, gen):
    wf = workflows.build(_spec(tiny_dir), tokenizer)
    with RolloutManager(gen, wf, _samples(tokenizer), max_staleness=2) as m:
        first = m.next_groups(2)
        # 2 steps of 2 groups may be generated ahead of the trainer, not more.
        wait_for(lambda: len(gen.calls) == 6, 30, "look-ahead")
        time.sleep(0.3)
        assert len(gen.calls) == 6
        gen.version = 1
        second = m.next_groups(2, policy_version=1)  # version 0 is within the bound: used
        assert {c.policy_version for g in second for c in g.completions} == {0}
        gen.version = 3
        third = m.next_groups(2, policy_version=3)  # version 0 and 1 groups are now too old
        versions = {c.policy_version for g in third for c in g.completions}
        assert min(versions) >= 1 and m.stats["stale_dropped"] >= 1
        indices = [g.sample.index for g in first + second + third]
        assert len(set(indices)) == 6  # dropped samples are generated again, never lost or repeated


def test_given_samples_mode_is_the_trainers_group_source(tiny_dir, tokenizer, gen):
    wf = workflows.build(_spec(tiny_dir), tokenizer)
    samples = list(_samples(tokenizer, 3))
    gen.version = 4
    with RolloutManager(gen, wf, max_staleness=0) as m:
        groups = m.next_groups(samples, 4)
    assert [g.sample.index for g in groups] == [0, 1, 2]
    assert {c.policy_version for g in groups for c in g.completions} == {4}


def test_failures_are_clear_errors(tiny_dir, tokenizer, gen):
    class Flaky:
        fail = True

        async def run(self, client, sample):
            if self.fail:
                self.fail = False
                raise KeyError("answer")
            return await workflows.SingleTurn(_spec(tiny_dir), tokenizer).run(client, sample)

    with RolloutManager(gen, Flaky(), _samples(tokenizer, 2)) as m:
        with pytest.raises(RolloutError, match="workflow Flaky failed on sample 0: KeyError"):
            m.next_groups(1)
        assert [g.sample.index for g in m.next_groups(2)] in ([0, 1], [1, 0])  # sample 0 retried
        with pytest.raises(RolloutError, match="sample source is exhausted"):
            m.next_groups(1)
