"""The train stage alone: grpojob's trainer on the same fixed batch of groups, liger's kernels off
and on (GRPOJOB_LIGER, grpojob.learner.kernels), side by side.

Each setting runs in a process of its own (liger patches the transformers module it is applied
to, process-wide), both built from the same job on the same model; they take turns step by step
on the same groups (random completions of --max-tokens tokens, rewards that differ within every
group so that nothing is skipped). Per setting: the median over the steps after the first
(compilation) of trained tokens per second and the step record's MFU (grpojob.learner.flops:
model FLOPs per trained token against the GPU's dense bf16 peak; none on a CPU), and the
micro-batch budget the trainer chose (sized from free memory on CUDA when --micro-batch-tokens is
left out).

    python benchmarks/train_stage.py                                       # tiny, CPU (liger off only)
    python benchmarks/train_stage.py --device cuda --shape qwen2.5-0.5b --liger both
    python benchmarks/train_stage.py --device cuda --shape qwen2.5-0.5b --liger on --steps 4 --profile
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_throughput import SHAPES, build_model, job_doc  # noqa: E402 - the benchmarks' shapes and job

SETTINGS = {"off": "0", "on": "1"}


def _groups(a: argparse.Namespace, vocab: int):
    from grpojob.contracts.rollout import Completion, Group, Sample

    rnd = random.Random(0)
    groups = []
    for i in range(a.prompts):
        prompt = [rnd.randrange(3, vocab) for _ in range(24)]
        comps = [Completion(prompt_ids=prompt, completion_ids=[rnd.randrange(3, vocab) for _ in range(a.max_tokens)],
                            logprobs=[-1.0] * a.max_tokens, policy_version=0, finish_reason="length")
                 for _ in range(a.group)]
        groups.append(Group(sample=Sample(index=i, prompt="", prompt_ids=prompt), completions=comps,
                            rewards=[rnd.random() for _ in comps]))
    return groups


def _turns(conn, setting: str, model: Path, a: argparse.Namespace) -> None:
    """One setting's trainer: a step per message, answering (seconds, trained tokens, FLOPs, budget)."""
    import logging
    import warnings

    os.environ["GRPOJOB_LIGER"] = SETTINGS[setting]
    os.environ["GRPOJOB_DEVICE"] = a.device
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    from grpojob.api import parse
    from grpojob.learner.trainer import GRPOTrainer

    trainer = GRPOTrainer(parse(job_doc(model, a)))
    groups = _groups(a, min(trainer.model.config.vocab_size, len(trainer.tokenizer)))
    conn.send((trainer.fused, trainer.peak_flops))
    steps = 0
    while conn.recv():
        steps += 1
        if a.device == "cuda":
            torch.cuda.synchronize()
        profiling = getattr(a, "profile", False) and steps == a.steps  # the last step: warm
        prof = _profiler(a.device) if profiling else contextlib.nullcontext()
        t0 = time.perf_counter()
        with prof:
            prep, _ = trainer.step_training(groups)
            if a.device == "cuda":
                torch.cuda.synchronize()
        conn.send((time.perf_counter() - t0, prep.n_tokens, trainer.train_flops(prep), trainer.budget.cap))
        if profiling:
            key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
            print(f"liger {setting}, step {steps}: the operators of most {key}", flush=True)
            print(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60), flush=True)


def _profiler(device: str):
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []))


def compare(model: Path, a: argparse.Namespace, settings: list[str]) -> dict[str, dict]:
    """{setting: tokens_per_second, mfu, fused, budget}, the settings' trainers taking turns."""
    ctx = multiprocessing.get_context("spawn")
    procs, conns, out = {}, {}, {}
    for s in settings:
        conns[s], child = ctx.Pipe()
        procs[s] = ctx.Process(target=_turns, args=(child, s, model, a), daemon=True)
        procs[s].start()
    try:
        info = {s: conns[s].recv() for s in settings}
        print(f"trainers ready: {', '.join(settings)}", flush=True)
        runs: dict[str, list] = {s: [] for s in settings}
        for k in range(a.steps):
            for s in settings:
                conns[s].send(True)
                runs[s].append(conns[s].recv())
                sec, tokens = runs[s][-1][:2]
                # as it goes: a run cut off by its caller's limit still shows its steps
                print(f"step {k + 1}, liger {s}: {sec:.2f} s, {tokens / sec:.0f} tok/s", flush=True)
        for s in settings:
            conns[s].send(False)
    finally:
        for p in procs.values():
            p.join(60)
    for s in settings:
        fused, peak = info[s]
        warm = runs[s][1:] or runs[s]
        rate = statistics.median(t / sec for sec, t, _, _ in warm)
        fps = statistics.median(f / sec for sec, _, f, _ in warm)
        out[s] = {"tokens_per_second": rate, "flops": fps, "mfu": fps / peak if peak else None, "fused": fused,
                  "budget": runs[s][-1][3], "first_seconds": runs[s][0][0]}
    return out


def report(figures: dict[str, dict]) -> None:
    for s, f in figures.items():
        mfu = f" = {f['mfu']:.1%} MFU" if f["mfu"] is not None else f" ({f['flops'] / 1e12:.3g} TFLOP/s)"
        kernels = "liger kernels" if f["fused"] else "own layers (compiled on CUDA)"
        budget = f", micro-batches up to {f['budget']} tokens (from free memory)" if f["budget"] else ""
        print(f"train stage, liger {s}: {f['tokens_per_second']:.0f} tok/s{mfu}, {kernels}, "
              f"first step {f['first_seconds']:.1f} s{budget}", flush=True)
    if len(figures) == 2:
        print(f"liger on / off: {figures['on']['tokens_per_second'] / figures['off']['tokens_per_second']:.2f}x "
              f"train-stage tokens/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--liger", choices=["on", "off", "both"], default="both")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, help="completion tokens (default: per shape)")
    p.add_argument("--steps", type=int, default=5, help="steps of each setting (the first warms up)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--micro-batch-tokens", type=int, help="default: from free memory on CUDA, per shape on CPU")
    p.add_argument("--profile", action="store_true",
                   help="profile the last step (torch.profiler) and print its operators of most device time")
    a = p.parse_args()
    a.max_tokens = a.max_tokens or SHAPES[a.shape][1]["max_tokens"]
    if a.micro_batch_tokens is None and a.device == "cpu":
        a.micro_batch_tokens = SHAPES[a.shape][1]["micro_batch_tokens"]
    settings = ["off", "on"] if a.liger == "both" else [a.liger]
    if a.device == "cpu" and "on" in settings:
        print("liger's kernels are CUDA only: measuring liger off on the CPU")
        settings = ["off"]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(a.shape, Path(tmp) / "model")
        print(f"model {a.shape}, {a.prompts} groups x {a.group} completions x {a.max_tokens} tokens, "
              f"{a.steps} steps each on {a.device}")
        report(compare(model, a, settings))


if __name__ == "__main__":
    main()
