"""Trainer throughput: grpojob's trainer against TRL's GRPOTrainer, side by side in one run.

Same model (the tiny/small random Qwen2 built locally), same toy prompts and reward, same group
size, completion length, prompts per optimizer step and learning rate; both sample with
transformers `generate` on this CPU (TRL: use_vllm=False, bf16=False, no gradient
checkpointing, as NOTES.md says it needs). Throughput is end-to-end training tokens per second
(prompt + completion tokens of every sampled completion, per second of full steps: generate,
score, optimise), the median over the steps after the first (warm-up), the two trainers taking
turns step by step so both see the same load on a shared machine; and train-only tokens per
second (the step minus generation and scoring). Prints each and the ratios.

    python benchmarks/trainer_throughput.py                  # tiny model (about 1 minute)
    python benchmarks/trainer_throughput.py --size small     # about 17M parameters (minutes)
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path


def job_doc(model: Path, a: argparse.Namespace) -> dict:
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "bench"},
            "spec": {"model": {"path": str(model)}, "dataset": {"factory": "toy", "maxPromptLength": 32},
                     "rewards": [{"name": "toy"}],
                     "algorithm": {"name": "grpo", "groupSize": a.group, "lossAggregation": "token-mean"},
                     "training": {"steps": a.steps, "promptsPerStep": a.prompts, "learningRate": a.lr,
                                  "microBatchTokens": a.micro_batch_tokens},
                     "rollout": {"backend": "hf", "sampling": {"maxTokens": a.max_tokens}},
                     "checkpoint": {"path": "unused", "everySteps": 10_000, "resume": False}}}


class Ours:
    """grpojob's Trainer, stepped one step at a time."""

    def __init__(self, model: Path, a: argparse.Namespace, work: Path):
        from grpojob.api import parse
        from grpojob.trainer.loop import Trainer

        self.trainer = Trainer(parse(job_doc(model, a)), checkpoint_dir=str(work / "ours-ck"))
        self.seconds: list[float] = []
        self.train_seconds: list[float] = []
        self.tokens: list[int] = []

    def step(self) -> None:
        t0 = time.perf_counter()
        record = self.trainer.step()
        self.seconds.append(time.perf_counter() - t0)
        self.train_seconds.append(record["stage_seconds"]["train"])
        self.tokens.append(record["tokens"])


def run_side_by_side(model: Path, a: argparse.Namespace, work: Path) -> tuple[Ours, dict[str, list]]:
    """TRL trains; after each of its steps, ours does one step. Alternating step by step puts
    both under the same machine load (this CPU is shared), instead of one run after the other."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpojob.data.builtin import toy as toy_rows
    from grpojob.rewards.builtin import toy as toy_reward

    def reward(prompts, completions, answer, **_):
        return [toy_reward(p, c, answer=x) for p, c, x in zip(prompts, completions, answer)]

    ours = Ours(model, a, work)
    n = a.prompts * a.group
    micro = max(a.group, n // a.accumulation)
    cfg = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=micro,
                     gradient_accumulation_steps=n // micro, num_generations=a.group,
                     max_completion_length=a.max_tokens, learning_rate=a.lr, beta=0.0, loss_type="dapo",
                     lr_scheduler_type="constant", use_vllm=False, bf16=False, gradient_checkpointing=False,
                     max_steps=a.steps, logging_steps=1, save_strategy="no", report_to="none",
                     disable_tqdm=True, temperature=1.0, seed=0, dataloader_num_workers=0, use_cpu=True)
    tok = AutoTokenizer.from_pretrained(model)
    ds = datasets.Dataset.from_list(list(toy_rows(size=256)))
    trl = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=reward, args=cfg,
                      train_dataset=ds, processing_class=tok)
    trl.remove_callback(PrinterCallback)
    seconds: list[float] = []
    train_seconds: list[float] = []
    sampling: list[float] = []  # TRL: generation and scoring inside each step
    tokens: list[int] = []
    generate_and_score = trl._generate_and_score_completions

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return generate_and_score(*args, **kw)
        finally:
            sampling.append(time.perf_counter() - t0)

    trl._generate_and_score_completions = timed  # instrumentation only: times TRL's own call

    class Alternate(TrainerCallback):
        start = 0.0
        seen = 0

        def on_step_begin(self, args, state, control, **kw):
            Alternate.start = time.perf_counter()
            sampling.clear()

        def on_step_end(self, args, state, control, **kw):
            seconds.append(time.perf_counter() - Alternate.start)
            train_seconds.append(seconds[-1] - sum(sampling))
            tokens.append(state.num_input_tokens_seen - Alternate.seen)
            Alternate.seen = state.num_input_tokens_seen
            ours.step()

    trl.add_callback(Alternate())
    trl.train()
    return ours, {"seconds": seconds, "train_seconds": train_seconds, "tokens": tokens}


def _rate(seconds: list[float], tokens: list[int]) -> float:
    """Median over steps 2..N (the first warms up) of each step's tokens per second: the median
    shrugs off the load spikes of a shared machine that a plain average would pick up."""
    return statistics.median(t / s for t, s in zip(tokens[1:], seconds[1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "small"], default="tiny")
    p.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=64, help="completion length limit")
    p.add_argument("--steps", type=int, default=8, help="steps of each trainer")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--micro-batch-tokens", type=int, default=4096, help="ours: packed tokens per micro-batch")
    p.add_argument("--accumulation", type=int, default=4, help="TRL: gradient accumulation micro-batches")
    p.add_argument("--model", type=Path, help="an existing model directory instead of building one")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = a.model
        if model is None:
            from grpojob.tiny import build
            model = build(work / "model", size=a.size)
        print(f"model {a.model or a.size}, {a.prompts} prompts x {a.group} completions x <= {a.max_tokens} tokens "
              f"per step, {a.steps} steps (first one is warm-up), torch threads {torch.get_num_threads()}")
        mine, theirs = run_side_by_side(model, a, work)
    rows = [("grpojob", mine.seconds, mine.train_seconds, mine.tokens),
            ("trl", theirs["seconds"], theirs["train_seconds"], theirs["tokens"])]
    print(f"{'trainer':<10} {'tokens/s':>10} {'train-only tokens/s':>20} {'tokens':>8} {'median s/step':>14}")
    rates = {}
    for name, seconds, train, tokens in rows:
        rates[name] = (_rate(seconds, tokens), _rate(train, tokens))
        print(f"{name:<10} {rates[name][0]:>10.0f} {rates[name][1]:>20.0f} {sum(tokens[1:]):>8d} "
              f"{statistics.median(seconds[1:]):>14.2f}")
    print(f"ratio grpojob / trl: {rates['grpojob'][0] / rates['trl'][0]:.2f}x end to end, "
          f"{rates['grpojob'][1] / rates['trl'][1]:.2f}x train only (step minus generate and score)")


if __name__ == "__main__":
    main()
