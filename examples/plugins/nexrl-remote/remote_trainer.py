"""NexRL's remote-API trainer, ported to a GRPOJob in mode service (examples/plugins/nexrl-remote).

NexRL's RemoteApiTrainer works on trajectories in its own process and leaves the heavy part to a
training service (Tinker, Weaver): `train(trajectories)` prepares them (`_prepare_trajectories`,
the hook a custom trainer such as NexRL's MyRemoteTrainer overrides), turns them into self-contained
datums, then calls forward_backward(datums, loss_fn), optim_step and save_weights_for_sampler.
Here the service is the GRPOJob (grpojob.client, Tinker's calls and types), and the rollout side
is a few lines over the service's sample call. The task is the tiny toy task of
examples/tiny-local.yaml (dataset factory `toy`, reward `toy`):

    python examples/plugins/nexrl-remote/remote_trainer.py --run-dir runs/nexrl-remote [--steps 30]

It prints one JSON line per step (reward, loss, policy version); --metrics also writes them to a file.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import cycle, islice
from typing import Any, Iterator

from grpojob.client import AdamParams, Datum, ModelInput, SamplingClient, SamplingParams, ServiceClient, TrainingClient
from grpojob.plugins import builtin_dataset, builtin_reward

toy_rows, toy_reward = builtin_dataset("toy"), builtin_reward("toy")


@dataclass
class Trajectory:
    """The fields of NexRL's Trajectory this trainer reads."""
    tokens: list[int]  # prompt + completion
    loss_mask: list[int]  # 1 on the completion's tokens
    logprobs: list[float]  # the sampler's log-probs, 0 on the prompt
    reward: float
    run_id: int  # the rollout run that produced it: one prompt, its group of samples
    extra_fields: dict[str, Any] = field(default_factory=dict)


class RemoteApiTrainer:
    """NexRL's base: subclasses implement _prepare_trajectories (advantages into extra_fields)."""

    def __init__(self, training: TrainingClient, config: dict[str, Any]):
        self.training = training
        self.loss_fn = config.get("loss_fn", "importance_sampling")
        self.adam = AdamParams(learning_rate=config.get("learning_rate", 2e-6), beta1=config.get("beta1"),
                               beta2=config.get("beta2"), eps=config.get("eps"),
                               weight_decay=config.get("weight_decay"), grad_clip_norm=config.get("grad_clip_norm"))
        self.train_step = 0

    def _prepare_trajectories(self, trajectories: list[Trajectory], metrics: dict[str, Any]) -> list[Trajectory]:
        raise NotImplementedError

    def train(self, trajectories: list[Trajectory]) -> tuple[dict[str, Any], str]:
        """One training step on the service; returns its metrics and the new sampling path."""
        metrics: dict[str, Any] = {"reward_mean": statistics.fmean(t.reward for t in trajectories)}
        trajectories = self._prepare_trajectories(trajectories, metrics)
        datums = [to_datum(t) for t in trajectories]
        # Both calls are queued at once and run in order on the trainer.
        fwd = self.training.forward_backward(datums, self.loss_fn)
        step = self.training.optim_step(self.adam)
        metrics["loss"] = fwd.result().metrics["loss:sum"]
        metrics["grad_norm"] = step.result().metrics["grad_norm"]
        self.train_step += 1
        saved = self.training.save_weights_for_sampler(name=f"step_{self.train_step:06d}").result()
        metrics["policy_version"] = saved.policy_version
        return metrics, saved.path


class MyRemoteTrainer(RemoteApiTrainer):
    """Group-normalised advantages (GRPO): per rollout run, (r - mean) / (std + eps), spread over
    the completion's tokens and divided by the step's completion tokens (a token mean, as the
    trainer's own default lossAggregation; the service's losses are sums)."""

    def __init__(self, training: TrainingClient, config: dict[str, Any]):
        super().__init__(training, config)
        self.eps = config.get("advantage_eps", 1e-6)

    def _prepare_trajectories(self, trajectories: list[Trajectory], metrics: dict[str, Any]) -> list[Trajectory]:
        groups: dict[int, list[Trajectory]] = defaultdict(list)
        for t in trajectories:
            groups[t.run_id].append(t)
        tokens = sum(sum(t.loss_mask) for t in trajectories) or 1
        flat = []
        for group in groups.values():
            rewards = [t.reward for t in group]
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
            for t in group:
                adv = (t.reward - mean) / (std + self.eps)
                t.extra_fields["advantages"] = [adv * m / tokens for m in t.loss_mask]
                flat.append(adv)
        metrics["advantage_abs_mean"] = statistics.fmean(abs(a) for a in flat)
        metrics["groups"] = len(groups)
        return trajectories


def to_datum(t: Trajectory) -> Datum:
    """Tinker's alignment: position i of the input predicts token i + 1 of the trajectory."""
    return Datum(model_input=ModelInput.from_ints(t.tokens[:-1]),
                 loss_fn_inputs={"target_tokens": t.tokens[1:], "logprobs": t.logprobs[1:],
                                 "advantages": t.extra_fields["advantages"][1:]})


def rollout(sampler: SamplingClient, tokenizer, rows: list[dict], group_size: int, first_run_id: int,
            sampling: SamplingParams) -> list[Trajectory]:
    """One group per row, all sampled at once, scored with the toy reward."""
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in rows]
    futures = [sampler.sample(ModelInput.from_ints(p), group_size, sampling) for p in prompts]
    out = []
    for k, (row, prompt, fut) in enumerate(zip(rows, prompts, futures)):
        for seq in fut.result().sequences:
            out.append(Trajectory(tokens=prompt + seq.tokens, loss_mask=[0] * len(prompt) + [1] * len(seq.tokens),
                                  logprobs=[0.0] * len(prompt) + seq.logprobs,
                                  reward=toy_reward(row["prompt"], seq.text, row["answer"]), run_id=first_run_id + k))
    return out


def rows_forever(seed: int) -> Iterator[dict]:
    return cycle(list(toy_rows(size=64, seed=seed)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="the `grpojob run` directory (endpoints.json, token)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=6e-3)
    ap.add_argument("--metrics", help="also append each step's JSON line to this file")
    ap.add_argument("--tokenizer", help="the model's tokenizer here (default: the job's spec.model path, as on "
                    "this machine after `grpojob run`)")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    with ServiceClient.from_run_dir(args.run_dir) as service:
        info = service.wait_ready(timeout=600)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or info.tokenizer_path)
        training = service.create_training_client()
        trainer = MyRemoteTrainer(training, {"loss_fn": "importance_sampling", "learning_rate": args.learning_rate})
        sampler = service.create_sampling_client()
        sampling = SamplingParams(max_tokens=info.sampling["max_tokens"], temperature=1.0)
        rows = rows_forever(seed=0)
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            batch = list(islice(rows, args.prompts_per_step))
            trajectories = rollout(sampler, tokenizer, batch, args.group_size, step * args.prompts_per_step, sampling)
            metrics, sampling_path = trainer.train(trajectories)
            # NexRL's set_current_sampling_path: the next samples come from the weights just pushed
            sampler = service.create_sampling_client(model_path=sampling_path)
            line = json.dumps({"step": step, **metrics, "seconds": round(time.perf_counter() - t0, 3)})
            print(line, flush=True)
            if args.metrics:
                with open(args.metrics, "a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
