"""A TRL rollout_func (written for trl 1.16's GRPOTrainer(rollout_func=...); no grpojob import): two
turns per completion, the model's first answer, an environment observation (" more :", not the
model's: env_mask 0), then its second answer. It generates with the trainer's vLLM client, as a
rollout_func in TRL's vLLM server mode does."""

OBSERVATION = " more :"


def rollout_func(prompts, trainer):
    tok = trainer.processing_class
    client = trainer.vllm_generation.vllm_client
    max_tokens = trainer.args.max_completion_length
    first = client.generate(prompts=list(prompts), n=1, max_tokens=max_tokens, temperature=trainer.args.temperature)
    obs = tok(OBSERVATION, add_special_tokens=False)["input_ids"]
    seconds = client.generate(prompts=[p + c + obs for p, c in zip(first["prompt_ids"], first["completion_ids"])],
                              n=1, max_tokens=max_tokens, temperature=trainer.args.temperature)
    out = {"prompt_ids": first["prompt_ids"], "completion_ids": [], "logprobs": [], "env_mask": []}
    for i, (c1, c2) in enumerate(zip(first["completion_ids"], seconds["completion_ids"])):
        out["completion_ids"].append(c1 + obs + c2)
        out["logprobs"].append([lp[0] for lp in first["logprobs"][i]] + [0.0] * len(obs)
                               + [lp[0] for lp in seconds["logprobs"][i]])
        out["env_mask"].append([1] * len(c1) + [0] * len(obs) + [1] * len(c2))
    return out
