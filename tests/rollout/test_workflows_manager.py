"""Workflows (built-in and plug-in) and the RolloutManager's pipeline rules — run-ahead bounded by
maxStaleness from the published version, stale groups generated again, dynamic-sampling refills,
checkpointed pending prompts, derived seeds — with a real in-process generator (hf_generate on
the tiny model) and the real reward scorer."""
from __future__ import annotations

import asyncio
import time

import pytest

from grpojob.api import plugins
from grpojob.data import PromptSettings, PromptStream
from grpojob.rewards import RewardError, RewardScorer
from grpojob.leader import workflows
from grpojob.leader.rollout_client import RolloutError
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.contracts.rollout import derive_seed
from grpojob.contracts.rollout import GroupRejected, Sample

from .harness import greedy, load_model, make_job, wait_for
from .inprocess import ModelGenerator

GROUP = 3


@pytest.fixture(scope="module")
def model(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture
def gen(model, tokenizer):
    return ModelGenerator(model, tokenizer)


def _job(tiny_dir, workflow="single-turn", **over):
    return make_job(tiny_dir, algorithm={"groupSize": GROUP, **over.pop("algorithm", {})},
                    rollout={"workflow": workflow, "sampling": {"maxTokens": 4}},
                    dataset=over.pop("dataset", {"factory": "toy", "args": {"size": 40}, "maxPromptLength": 32}),
                    **over)


def _manager(job, tokenizer, gen, published=0, **pipeline):
    spec = job.spec
    return RolloutManager(gen, workflows.build(spec, tokenizer), RewardScorer(spec, tokenizer),
                          PromptStream(PromptSettings.of(spec), tokenizer), Pipeline.from_spec(spec, **pipeline), published=published)


def _versions(step):
    return {c.policy_version for g in step.groups for c in g.completions}


def test_registry_is_exactly_the_api_builtins(tiny_dir, tokenizer):
    assert tuple(workflows.WORKFLOWS) == plugins.BUILTIN_WORKFLOWS
    for name in plugins.BUILTIN_WORKFLOWS:
        assert isinstance(workflows.build(_job(tiny_dir, name).spec, tokenizer), workflows.WORKFLOWS[name])


def test_bad_plugins_are_named(tiny_dir, tokenizer):
    with pytest.raises(ValueError, match="rollout.workflow 'nope.mod:Wf': cannot import module 'nope.mod'"):
        workflows.build(_job(tiny_dir, "nope.mod:Wf").spec, tokenizer)
    with pytest.raises(ValueError, match="no `async def run"):
        workflows.build(_job(tiny_dir, "tests.rollout.plugin_workflows:NoRun").spec, tokenizer)


def test_single_turn_and_greedy_baseline(tiny_dir, tokenizer, gen):
    sample = Sample(index=0, prompt="name colors :", prompt_ids=tokenizer.encode("name colors :"))
    group = asyncio.run(workflows.build(_job(tiny_dir).spec, tokenizer).run(gen, sample))
    assert len(group.completions) == GROUP and group.baseline is None
    assert all(c.text == tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in group.completions)

    group = asyncio.run(workflows.build(_job(tiny_dir, "greedy-baseline").spec, tokenizer).run(gen, sample))
    assert len(group.completions) == GROUP
    greedy_calls = [c for c in gen.calls if c["sampling"].temperature == 0]
    assert len(greedy_calls) == 1 and greedy_calls[0]["n"] == 1
    assert group.baseline.completion_ids == greedy(gen.model, tokenizer, sample.prompt_ids, 4)[0]


def test_a_multi_turn_plugin_masks_tool_tokens_and_scores_itself(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, "tests.rollout.plugin_workflows:TwoTurnTool", training={"promptsPerStep": 2})
    with _manager(job, tokenizer, gen) as m:
        groups = m.next_step().groups
    assert len(groups) == 2
    wf = workflows.build(job.spec, tokenizer)
    for g in groups:
        for c in g.completions:
            assert len(c.loss_mask) == len(c.completion_ids) == len(c.logprobs)
            tool = [i for i, bit in enumerate(c.loss_mask) if bit == 0]
            assert [c.completion_ids[i] for i in tool] == wf.TOOL_REPLY
            assert 0.0 <= c.reward <= 1.0
        assert g.rewards == [c.reward for c in g.completions]  # the workflow's own scores win
    assert len(gen.calls) == 2 * (1 + GROUP)  # one first turn per group, one second turn per completion


@pytest.mark.parametrize("s, e, taken, published, ahead", [
    (0, 1, 4, 3, 0),   # training step 4 at maxStaleness 0: nothing runs ahead (the synchronous baseline)
    (0, 1, 4, 4, 1),   # version 4 pushed: step 5's groups
    (1, 1, 4, 3, 1),   # one version of staleness: step 5's groups while step 4 trains
    (2, 1, 4, 3, 2),
    (0, 2, 2, 2, 2),   # pushes every 2nd step: version 2 serves steps 3 and 4
    (0, 2, 3, 2, 1),
    (0, 2, 4, 2, 0),
    (1, 2, 2, 2, 2),   # step 5 needs version >= 4 - 1: not a version-2 group
    (3, 1, 8, 7, 2),   # never beyond training.steps (10)
])
def test_run_ahead_follows_the_push_schedule(s, e, taken, published, ahead):
    p = Pipeline(prompts_per_step=4, total_steps=10, max_staleness=s, every_steps=e)
    assert p.steps_ahead(taken, published) == ahead


def test_staleness_0_generates_each_step_on_demand_at_the_published_version(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, training={"promptsPerStep": 3, "steps": 5})
    with _manager(job, tokenizer, gen) as m:
        first = m.next_step()
        assert [g.sample.seq for g in first.groups] == [0, 1, 2] and _versions(first) == {0}
        time.sleep(0.3)
        assert len(gen.calls) == 3 and first.in_flight == 0  # nothing generated while "training"
        gen.version = 1
        m.set_published(1)
        second = m.next_step()
        assert [g.sample.seq for g in second.groups] == [3, 4, 5] and _versions(second) == {1}
        assert all(c["min_version"] == 1 for c in gen.calls[3:])
        assert all(g.rewards is not None and len(g.rewards) == GROUP for g in first.groups + second.groups)


def test_pushes_every_other_step_at_staleness_0_do_not_hang(tiny_dir, tokenizer, gen):
    """The floor is computed from the last *published* version (everySteps 2): steps 2, 4, 6 train
    on groups one version behind the trainer instead of waiting for a version never pushed."""
    job = _job(tiny_dir, training={"promptsPerStep": 2, "steps": 6}, weightSync={"everySteps": 2})
    with _manager(job, tokenizer, gen) as m:
        lags = []
        for step in range(1, 7):
            got = m.next_step()  # the trainer is at version step - 1
            lags.append(max(step - 1 - v for v in _versions(got)))
            if step % 2 == 0 and step < 6:
                gen.version = step
                m.set_published(step)
    assert lags == [0, 1, 0, 1, 0, 1]
    assert max(c["min_version"] for c in gen.calls) == 4


def test_run_ahead_is_bounded_and_stale_groups_are_generated_again(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, training={"promptsPerStep": 2, "steps": 20}, algorithm={"maxStaleness": 2})
    with _manager(job, tokenizer, gen) as m:
        first = m.next_step()
        # published 0, maxStaleness 2: steps 2 and 3 may be generated ahead, not step 4
        wait_for(lambda: len(gen.calls) == 6, 30, "look-ahead")
        time.sleep(0.3)
        assert len(gen.calls) == 6
        gen.version = 1
        m.set_published(1)
        second = m.next_step()  # version 0 is within the bound: used
        assert _versions(second) == {0}
        gen.version = 3
        m.set_published(3)  # floor 1: the ready version-0 groups are too old now
        third = m.next_step()
        assert min(_versions(third)) >= 1 and third.stale >= 1
        steps = [[g.sample.seq for g in step.groups] for step in (first, second, third)]
        assert all(seqs == sorted(seqs) for seqs in steps)  # a step takes the oldest ready prompts first
        trained, pending = sum(steps, []), m.state_dict()["pending"]
        # regenerated, never lost or repeated: every prompt issued is trained or still pending
        assert len(set(trained)) == 6 and not set(trained) & set(pending)
        assert sorted(trained + pending) == list(range(len(trained) + len(pending)))


def _even_rows_all_right(prompt, completion, **row):
    """Zero reward variance for even rows (every completion 1.0), a spread for odd ones (sampled
    completions of a random model differ)."""
    return 1.0 if row["idx"] % 2 == 0 else sum(map(ord, completion)) % 97 / 97


def test_dynamic_sampling_refills_dropped_groups_up_to_the_resample_factor(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, training={"promptsPerStep": 4, "steps": 3},
               rewards=[{"name": f"{__name__}:_even_rows_all_right"}],
               dataset={"factory": "tests.rollout.test_workflows_manager:indexed_rows", "maxPromptLength": 32,
                        "shuffle": False},
               algorithm={"dynamicSampling": True, "maxResampleFactor": 1.5})
    with _manager(job, tokenizer, gen) as m:
        step = m.next_step()
    rows = [g.sample.row["idx"] for g in step.groups]
    # rows 0..3 considered first (0 and 2 dropped), then refills 4 and 5 (4 dropped): 6 = 1.5 x 4
    assert rows == [0, 1, 2, 3, 4, 5] and step.resampled == 2
    assert sum(len(set(g.rewards)) > 1 for g in step.groups) == 3  # fewer than 4: the budget ran out


def indexed_rows(size: int = 64):
    return ({"prompt": f"name animals {i} :", "answer": "animals", "idx": i} for i in range(size))


def test_pending_prompts_are_checkpointed_and_generated_exactly_once_after_a_resume(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, training={"promptsPerStep": 3, "steps": 10}, algorithm={"maxStaleness": 1})
    trained = []

    def step(m):  # what the trainer loop does: take a step, train, push its version
        trained.extend(g.sample.seq for g in m.next_step().groups)
        gen.version = m.taken
        m.set_published(m.taken)

    with _manager(job, tokenizer, gen) as m:
        for _ in range(2):
            step(m)
        wait_for(lambda: len(m.state_dict()["pending"]) == 6, 30, "two steps generated ahead")
        state = m.state_dict()  # a checkpoint after step 2: steps 3 and 4 are generated or generating
        # a step takes the oldest *ready* groups: which 6 prompts are pending depends on which
        # generations finished first, not which ones were issued first
        assert state["taken"] == 2 and len(state["pending"]) == 6
        assert sorted(trained + state["pending"]) == list(range(12))
    with _manager(job, tokenizer, gen, published=2) as resumed:
        resumed.load_state_dict(state)
        for _ in range(3):
            step(resumed)
        pending = resumed.state_dict()["pending"]
    # none skipped, none trained twice: the prompts issued are those trained plus those pending
    assert len(trained) == len(set(trained)) == 15 and not set(trained) & set(pending)
    assert sorted(trained + pending) == list(range(15 + len(pending)))


def test_seeds_come_from_the_training_seed_the_stream_position_and_the_attempt(tiny_dir, tokenizer, model):
    def seeds(seed):
        g = ModelGenerator(model, tokenizer)
        with _manager(_job(tiny_dir, training={"promptsPerStep": 3, "steps": 2, "seed": seed}), tokenizer, g) as m:
            m.next_step()
        return [c["sampling"].seed for c in g.calls]

    first = seeds(7)
    assert sorted(first) == sorted(derive_seed(derive_seed(7, seq, 0), 0) for seq in range(3))
    assert sorted(seeds(7)) == sorted(first) and set(seeds(8)).isdisjoint(first)


def _failing_reward(prompt, completion, **_):
    raise KeyError("no such field")


def test_failures_are_clear_errors_and_lose_no_prompt(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, training={"promptsPerStep": 2, "steps": 5})

    class Flaky:
        fail = True

        async def run(self, client, sample):
            if self.fail:
                self.fail = False
                raise KeyError("answer")
            return await workflows.SingleTurn(job.spec, tokenizer).run(client, sample)

    spec = job.spec
    with RolloutManager(gen, Flaky(), RewardScorer(spec, tokenizer), PromptStream(PromptSettings.of(spec), tokenizer),
                        Pipeline.from_spec(spec)) as m:
        with pytest.raises(RolloutError, match="workflow Flaky failed on sample .*: KeyError"):
            m.next_step()
        assert [g.sample.seq for g in m.next_step().groups] == [0, 1]  # the failed one generated again

    bad = _job(tiny_dir, rewards=[{"name": f"{__name__}:_failing_reward"}])
    with _manager(bad, tokenizer, gen) as m:
        with pytest.raises(RewardError, match=r"reward '.*_failing_reward' \(spec.rewards\[0\]\) failed: KeyError"):
            m.next_step()


class RejectingEvenRows(workflows.SingleTurn):
    """A workflow whose own filter refuses the groups of even rows (GroupRejected, as AReaL's
    dynamic_filter_fn does through grpojob.integrations.areal)."""

    async def run(self, client, sample):
        group = await super().run(client, sample)
        if sample.row["idx"] % 2 == 0:
            raise GroupRejected(f"row {sample.row['idx']} refused", group=group)
        return group


def test_a_group_the_workflow_rejects_is_dropped_and_the_next_prompt_drawn(tiny_dir, tokenizer, gen):
    job = _job(tiny_dir, f"{__name__}:RejectingEvenRows", training={"promptsPerStep": 3, "steps": 3},
               dataset={"factory": "tests.rollout.test_workflows_manager:indexed_rows", "maxPromptLength": 32,
                        "shuffle": False})
    with _manager(job, tokenizer, gen) as m:
        first = m.next_step()
        gen.version = 1
        m.set_published(1)  # what the trainer does after the step: the next one may be generated
        second = m.next_step()
    # no error, no rejected row trained, none generated again: the odd rows in stream order
    assert sorted(g.sample.row["idx"] for g in first.groups) == [1, 3, 5]
    assert sorted(g.sample.row["idx"] for g in second.groups) == [7, 9, 11]
