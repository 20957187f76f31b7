"""AReaL's own RLVRWorkflow, unchanged, as a GRPOJob's rollout workflow (grpojob.integrations.areal).

The workflow is built as an AReaL training script builds it, with AReaL's reward signature
`reward_fn(prompt, completions, prompt_ids, completion_ids, **data)` (AReaL runs it in a process pool)
and its prompt hooks (`data_extract_prompt_fn`, `get_input_ids_fn`: the row's plain prompt, no chat
template, like the toy task's other examples). The reward is the toy one (the share of words of the
asked category) plus 1, so the step record shows that AReaL's reward is the one trained on:
reward_mean = rewards["toy"] + 1 (the spec's `toy` reward is still computed and reported).

    spec.rollout.workflow: rlvr_toy.py:TOY_RLVR      (file in spec.code's directory)
"""
from areal.api.cli_args import GenerationHyperparameters
from areal.workflow.rlvr import RLVRWorkflow

from grpojob.integrations.areal import workflow
from grpojob.plugins import TOY_CATEGORIES, builtin_dataset


def toy_rows(size=64, seed=0):
    """The toy task's rows with the prompt under "question" (AReaL passes the row to the reward as
    keywords beside its own `prompt`): dataset.factory rlvr_toy.py:toy_rows, promptField question."""
    return [{"question": r["prompt"], "answer": r["answer"]} for r in builtin_dataset("toy")(size=size, seed=seed)]


def toy_reward_fn(prompt, completions, prompt_ids, completion_ids, answer=None, **data):
    words = completions.lower().split()
    members = TOY_CATEGORIES.get(answer, ())
    share = sum(w.isdigit() if members is None else w in members for w in words) / len(words) if words else 0.0
    return 1.0 + share


def plain_prompt(data):
    return data["question"]


def token_ids(prompt, tokenizer, enable_thinking):
    return tokenizer(prompt)["input_ids"]


def rlvr(spec, tokenizer):
    return RLVRWorkflow(reward_fn=toy_reward_fn, tokenizer=tokenizer, data_extract_prompt_fn=plain_prompt,
                        get_input_ids_fn=token_ids,
                        gconfig=GenerationHyperparameters(n_samples=1, max_new_tokens=spec.rollout.sampling.max_tokens))


TOY_RLVR = workflow(rlvr)


def varied(batch):
    """A dynamic_filter_fn as DAPO's dynamic sampling writes one for AReaL: keep a group only when
    its rewards differ (batch: the group's episodes concatenated, `rewards` one per episode)."""
    return bool(batch["rewards"].std() > 0)


# spec.rollout.workflow: rlvr_toy.py:TOY_RLVR_VARIED (trainer.train(workflow, dynamic_filter_fn=varied) in AReaL)
TOY_RLVR_VARIED = workflow(rlvr, dynamic_filter_fn=varied)
