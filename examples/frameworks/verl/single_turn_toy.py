"""verl's own SingleTurnAgentLoop, unchanged, as a GRPOJob's rollout workflow (grpojob.integrations.verl),
and a loop of a user's (a subclass scoring its own trajectories, as verl's loops may: `reward_score`).

    spec.rollout.workflow: single_turn_toy.py:SINGLE_TURN     (file in spec.code's directory)

The toy task's rows are given as verl's dataset format has them: `prompt` a list of chat messages
(SingleTurnAgentLoop renders them with the tokenizer's chat template), `data_source`, `reward_model`
(`ground_truth`: the category) and `extra_info`.
"""
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from grpojob.integrations.verl import agent_loop
from grpojob.plugins import builtin_dataset, builtin_reward

SINGLE_TURN = agent_loop(SingleTurnAgentLoop)


def toy_rows(size=64, seed=0):
    """dataset.factory single_turn_toy.py:toy_rows: the toy task in verl's row format."""
    return [{"data_source": "toy", "prompt": [{"role": "user", "content": r["prompt"]}],
             "reward_model": {"style": "rule", "ground_truth": r["answer"]}, "extra_info": {"index": i},
             "answer": r["answer"]}
            for i, r in enumerate(builtin_dataset("toy")(size=size, seed=seed))]


class ScoredSingleTurn(SingleTurnAgentLoop):
    """SingleTurnAgentLoop that scores its own trajectory (reward_score): the toy reward plus 1."""

    async def run(self, sampling_params, **kwargs):
        out = await super().run(sampling_params, **kwargs)
        text = self.tokenizer.decode(out.response_ids, skip_special_tokens=True)
        share = builtin_reward("toy")("", text, answer=kwargs["reward_model"]["ground_truth"])
        out.reward_score = 1.0 + share
        return out


SCORED = agent_loop(ScoredSingleTurn)
