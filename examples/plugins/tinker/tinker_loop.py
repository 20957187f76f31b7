"""A GRPO loop written against the real `tinker` SDK, driving a GRPOJob in mode service
(examples/plugins/tinker/tinker-lora.yaml) by its base_url and the job's token as Tinker's API key
(tml-<token>). It samples groups of the toy task of examples/tiny-local.yaml, scores them, computes
group-normalised advantages and trains with forward_backward(importance_sampling) and optim_step;
save_weights_and_get_sampling_client pushes each step's weights to the job's rollout servers.

    python examples/plugins/tinker/tinker_loop.py --run-dir runs/tinker [--steps 40]

One JSON line per step (reward, loss, policy version); --metrics also writes them to a file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from itertools import cycle, islice
from pathlib import Path

import tinker
from tinker import types

from grpojob.plugins import builtin_dataset, builtin_reward

toy_rows, toy_reward = builtin_dataset("toy"), builtin_reward("toy")


def datum(prompt: list[int], completion: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """Tinker's alignment: position i of the input predicts token i + 1 of prompt + completion."""
    full, pad = prompt + completion, len(prompt) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": full[1:], "logprobs": [0.0] * pad + list(logprobs),
                                       "advantages": [0.0] * pad + [advantage] * len(completion)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="the `grpojob run` directory (endpoints.json, token)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=3e-3)
    ap.add_argument("--lora-rank", type=int, default=8, help="the job's spec.model.lora.rank")
    ap.add_argument("--metrics", help="also append each step's JSON line to this file")
    args = ap.parse_args(argv)

    run_dir = Path(args.run_dir)
    base_url = json.loads((run_dir / "endpoints.json").read_text())["trainer-0"]
    token = (run_dir / "token").read_text().strip()
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-" + token)
    model = tinker.RestClient(base_url=base_url, api_key="tml-" + token).get_server_capabilities().result()
    base_model = model.supported_models[0].model_name  # the job's spec.model.path
    training = service.create_lora_training_client(base_model=base_model, rank=args.lora_rank).result()
    tokenizer = training.get_tokenizer()
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    rows = cycle(list(toy_rows(size=64, seed=0)))
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = list(islice(rows, args.prompts_per_step))
        prompts = [tokenizer(r["prompt"])["input_ids"] for r in batch]
        futures = [sampler.sample(types.ModelInput.from_ints(p), args.group_size, params) for p in prompts]
        groups = []
        for row, prompt, future in zip(batch, prompts, futures):
            seqs = future.result().sequences
            groups.append((prompt, seqs, [toy_reward(row["prompt"], tokenizer.decode(s.tokens), row["answer"])
                                          for s in seqs]))
        tokens = sum(len(s.tokens) for _, seqs, _ in groups for s in seqs)
        data = []
        for prompt, seqs, rewards in groups:  # group-normalised advantages, a token mean over the step
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
            data += [datum(prompt, s.tokens, s.logprobs, (r - mean) / (std + 1e-6) / tokens)
                     for s, r in zip(seqs, rewards)]
        fwd = training.forward_backward(data, "importance_sampling")
        opt = training.optim_step(types.AdamParams(learning_rate=args.learning_rate, grad_clip_norm=1.0))
        loss, metrics = fwd.result().metrics["loss:sum"], opt.result().metrics
        sampler = training.save_weights_and_get_sampling_client().result()
        line = json.dumps({"step": step, "reward_mean": statistics.fmean(r for _, _, rs in groups for r in rs),
                           "loss": loss, "policy_version": int(metrics["policy_version"]),
                           "seconds": round(time.perf_counter() - t0, 3)})
        print(line, flush=True)
        if args.metrics:
            with open(args.metrics, "a") as f:
                f.write(line + "\n")
    service.close("success").result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
