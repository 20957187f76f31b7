"""onFailure skip in the rollout manager: a group the judge could not score is no error; its prompt
is generated again and the step trains on it once the judge answers, no prompt lost or used twice."""
from __future__ import annotations

from grpojob.data import PromptSettings, PromptStream
from grpojob.leader import workflows
from grpojob.leader.manager import Pipeline, RolloutManager
from grpojob.rewards import RewardScorer
from grpojob.rewards.judges import GroupSkipped

from ..rollout.harness import load_model, make_job
from ..rollout.inprocess import ModelGenerator


def test_a_skipped_group_is_generated_again_and_the_step_goes_on(tiny_dir, tokenizer):
    job = make_job(tiny_dir, algorithm={"groupSize": 3}, rollout={"sampling": {"maxTokens": 4}},
                   dataset={"factory": "toy", "args": {"size": 40}, "maxPromptLength": 32},
                   training={"promptsPerStep": 2, "steps": 5})
    spec = job.spec
    scored: list[int] = []

    class JudgeDownOnce:
        """The scorer as the judge's onFailure skip leaves it: the first group is skipped."""
        inner = RewardScorer(spec, tokenizer)

        async def score_group(self, group):
            scored.append(group.sample.seq)
            if len(scored) == 1:
                raise GroupSkipped("judge 'words' could not score after 4 attempts: ConnectionRefusedError")
            await self.inner.score_group(group)

    with RolloutManager(ModelGenerator(load_model(tiny_dir), tokenizer), workflows.build(spec, tokenizer),
                        JudgeDownOnce(), PromptStream(PromptSettings.of(spec), tokenizer), Pipeline.from_spec(spec)) as m:
        first = m.next_step()  # no error: the skipped group came back
    assert sorted(g.sample.seq for g in first.groups) == [0, 1]  # no prompt lost, none used twice
    assert len(scored) == 3 and set(scored) == {0, 1} and scored.count(scored[0]) == 2  # skipped, scored again once
    assert all(g.rewards is not None for g in first.groups)
