"""AReaL's ReMax workflow in AReaL's own names (AReaL's customization guide, "Training Algorithm":
`ReMaxRLVRWorkflow.arun_episode(engine, data)` sends a sampled and a greedy `ModelRequest` through
`engine.agenerate` together and trains on the reward difference), run through
grpojob.integrations.areal. remax_workflow.py is the same algorithm written against grpojob's own
workflow API (`run(client, sample)`); it stays, for jobs that name it.

    spec.rollout.workflow: remax_areal.py:REMAX       (examples/plugins/areal/remax_areal.yaml)

Where this differs from the guide's text: the prompt goes through AReaL's own `apply_chat_template`
helper (`areal.utils.hf_utils`: transformers 5 answers a dict where the guide's transformers gave a
list), and the episode also returns `logprobs`, as AReaL's RLVRWorkflow does (the guide's REINFORCE
loss does not read them; the trainer here corrects stale samples with them). The guide trains the
reward difference with a REINFORCE loss, no group baseline: `workflow(..., group_baseline=False)`
keeps it so (with advantageNormalization none the advantage is sample_reward - greedy_reward).
"""
import asyncio
import uuid

import torch
from areal.api.cli_args import GenerationHyperparameters
from areal.api.engine_api import InferenceEngine
from areal.api.io_struct import ModelRequest
from areal.api.workflow_api import RolloutWorkflow
from areal.utils.hf_utils import apply_chat_template

from grpojob.integrations.areal import workflow
from grpojob.plugins import TOY_CATEGORIES, builtin_dataset


class ReMaxRLVRWorkflow(RolloutWorkflow):
    def __init__(self, reward_fn, gconfig, tokenizer, enable_thinking=False):
        self.reward_fn, self.gconfig, self.tokenizer = reward_fn, gconfig, tokenizer
        self.enable_thinking = enable_thinking

    async def arun_episode(self, engine: InferenceEngine, data):
        # Prepare input tokens from chat messages
        input_ids = apply_chat_template(self.tokenizer, data["messages"], tokenize=True,
                                        add_generation_prompt=True, enable_thinking=self.enable_thinking)
        rid = uuid.uuid4().hex
        # Create requests for both sampled and greedy generation
        sample_req = ModelRequest(rid=rid, input_ids=input_ids, gconfig=self.gconfig)
        greedy_req = ModelRequest(rid=rid, input_ids=input_ids, gconfig=self.gconfig.new(greedy=True))
        # Generate both responses concurrently
        resp, greedy_resp = await asyncio.gather(engine.agenerate(sample_req), engine.agenerate(greedy_req))

        # Calculate rewards for both completions
        prompt_str = self.tokenizer.decode(input_ids)
        completions_str = self.tokenizer.decode(resp.output_tokens)
        sample_reward = self.reward_fn(prompt=prompt_str, completions=completions_str, prompt_ids=resp.input_tokens,
                                       completion_ids=resp.output_tokens, **data)
        greedy_completions = self.tokenizer.decode(greedy_resp.output_tokens)
        greedy_reward = self.reward_fn(prompt=prompt_str, completions=greedy_completions,
                                       prompt_ids=greedy_resp.input_tokens, completion_ids=greedy_resp.output_tokens,
                                       **data)

        # Package results for training
        return dict(
            # Add batch dimension
            input_ids=torch.tensor(resp.input_tokens + resp.output_tokens).unsqueeze(0),
            loss_mask=torch.tensor([0] * resp.input_len + [1] * resp.output_len).unsqueeze(0),
            logprobs=torch.tensor([0.0] * resp.input_len + resp.output_logprobs).unsqueeze(0),
            versions=torch.tensor([-1] * resp.input_len + resp.output_versions).unsqueeze(0),
            attention_mask=torch.ones(resp.input_len + resp.output_len, dtype=torch.bool).unsqueeze(0),
            # Use reward difference across all tokens
            rewards=torch.tensor([float(sample_reward - greedy_reward)] * (resp.input_len + resp.output_len)),
        )


def toy_reward_fn(prompt, completions, prompt_ids, completion_ids, answer=None, **data):
    """The toy task's reward (the share of words of the asked category) in AReaL's signature."""
    words = completions.lower().split()
    members = TOY_CATEGORIES.get(answer, ())
    return sum(w.isdigit() if members is None else w in members for w in words) / len(words) if words else 0.0


def toy_messages(size=64, seed=0):
    """The toy task's rows as chat messages (dataset.factory; messagesField: messages)."""
    return [{"messages": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
            for r in builtin_dataset("toy")(size=size, seed=seed)]


def remax(spec, tokenizer):
    gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=spec.rollout.sampling.max_tokens)
    return ReMaxRLVRWorkflow(reward_fn=toy_reward_fn, gconfig=gconfig, tokenizer=tokenizer)


REMAX = workflow(remax, group_baseline=False)
