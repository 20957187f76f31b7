"""Generation at a real shape: the hf engine's decoder against transformers' `generate`, side by side.

Same model (a random Qwen2 of one of trainer_throughput.py's shapes, its full vocabulary: 151,936
entries for qwen2.5-0.5b), same prompts, rows and completion length, on the same device, taking
turns round by round. Figures:
- ours: the decoder's prefill (every prompt once, its KV copied to the group's other rows) and the
  median time of one decode step of every row, split into the model's forward, the output layer
  and sampling (hf_sampling: per-row parameters, counter-based noise);
- theirs: `generate` (do_sample, left-padded batch of rows), its time per new token;
- the memory a decode step's logits and sampling take above what was in use before it (on CUDA
  the allocator's peak; on CPU the process's peak resident set, where it can be read).
It ends with the ratio of their time per token to ours (> 1: ours is faster).

    python benchmarks/generation.py --shape qwen2.5-0.5b --rows 32 --max-tokens 4      # CPU, about 1 min
    python benchmarks/generation.py --device cuda --shape qwen2.5-0.5b --rows 128 --max-tokens 32

A step that takes longer than --stall-seconds dumps every thread's stack to stderr (faulthandler):
where a stall sits is then on record even if the run is killed.
"""
from __future__ import annotations

import argparse
import faulthandler
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_throughput import SHAPES, build_model  # noqa: E402 - the benchmarks' shapes, one place


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Peak:
    """Memory a block takes above what was in use when it began (CUDA: allocator peak)."""

    def __init__(self, device: torch.device):
        self.device, self.bytes = device, 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = max(self.bytes, torch.cuda.max_memory_allocated(self.device) - self.start)


def ours(model, prompts: list[list[int]], group: int, max_tokens: int, stall: float) -> dict:
    from grpojob.rollout import hf_generate
    from grpojob.contracts.rollout import SamplingParams

    device = next(model.parameters()).device
    sp = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    limit = max(len(p) for p in prompts) + max_tokens
    dec = hf_generate.Decoder(model, slots=len(prompts) * group, max_len=limit, eos_token_id=None)
    rows = [hf_generate.request_rows(i, p, group, sp, hf_generate.noise_keys(sp, group)) for i, p in enumerate(prompts)]
    faulthandler.dump_traceback_later(stall, exit=False)
    _sync(device)
    t0 = time.perf_counter()
    dec.admit(rows, 0)
    _sync(device)
    prefill = time.perf_counter() - t0
    steps, forward, head, sample = [], [], [], []
    peak = Peak(device)
    orig_logits, orig_sample = dec._logits, dec._sample

    def timed(fn, out):
        def wrapper(*args):
            _sync(device)
            t = time.perf_counter()
            r = fn(*args)
            _sync(device)
            out.append(time.perf_counter() - t)
            return r
        return wrapper
    dec._logits, dec._sample = timed(orig_logits, head), timed(orig_sample, sample)
    while dec.rows:
        faulthandler.dump_traceback_later(stall, exit=False)
        t0 = time.perf_counter()
        with peak:
            dec.step(0)
        _sync(device)
        steps.append(time.perf_counter() - t0)
    faulthandler.cancel_dump_traceback_later()
    for s, h, x in zip(steps, head, sample):
        forward.append(s - h - x)
    return {"prefill": prefill, "step": statistics.median(steps), "forward": statistics.median(forward),
            "head": statistics.median(head), "sample": statistics.median(sample), "steps": len(steps),
            "peak": peak.bytes}


def theirs(model, prompts: list[list[int]], group: int, max_tokens: int, pad: int) -> dict:
    device = next(model.parameters()).device
    rows = [p for p in prompts for _ in range(group)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, r in enumerate(rows):
        ids[j, width - len(r):] = torch.tensor(r)
        mask[j, width - len(r):] = 1
    ids, mask = ids.to(device), mask.to(device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                       max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=pad)
    _sync(device)
    return {"total": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rows", type=int, default=32, help="completions generated together (prompts x group)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="turns of each side after one warm-up turn; medians reported")
    p.add_argument("--stall-seconds", type=float, default=60.0, help="dump every thread's stack past this")
    p.add_argument("--model", type=Path, help="an existing model directory instead of building one")
    a = p.parse_args()
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what the hf engine runs on each
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model or build_model(a.shape, Path(tmp) / "model")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    n_prompts = max(1, a.rows // a.group)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(24)] for i in range(n_prompts)]
    rows = n_prompts * a.group
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{a.shape} (vocab {vocab}, {dtype}), {n_prompts} prompts x {a.group} = {rows} rows x {a.max_tokens} "
          f"tokens, {where}, torch {torch.__version__}", flush=True)
    mine, hf = [], []
    ours(model, prompts, a.group, a.max_tokens, a.stall_seconds)  # warm-up of both (kernels, allocator)
    theirs(model, prompts, a.group, a.max_tokens, tok.pad_token_id or 0)
    for r in range(a.rounds):
        mine.append(ours(model, prompts, a.group, a.max_tokens, a.stall_seconds))
        hf.append(theirs(model, prompts, a.group, a.max_tokens, tok.pad_token_id or 0))
        m = mine[-1]
        print(f"round {r + 1}: ours prefill {m['prefill']:.3f} s, decode step {m['step'] * 1e3:.1f} ms (forward "
              f"{m['forward'] * 1e3:.1f}, output layer {m['head'] * 1e3:.1f}, sampling {m['sample'] * 1e3:.1f}); "
              f"transformers generate {hf[-1]['total']:.3f} s", flush=True)
    med = {k: statistics.median(x[k] for x in mine) for k in ("prefill", "step", "forward", "head", "sample")}
    ours_total = med["prefill"] + med["step"] * (a.max_tokens - 1)
    theirs_total = statistics.median(x["total"] for x in hf)
    logits = rows * vocab * 4
    peak = max(x["peak"] for x in mine)
    print(f"ours: {ours_total / a.max_tokens * 1e3:.1f} ms per token of every row ({med['step'] * 1e3:.1f} ms per "
          f"decode step: forward {med['forward'] * 1e3:.1f}, output layer {med['head'] * 1e3:.1f}, sampling "
          f"{med['sample'] * 1e3:.1f}); float32 logits {logits / 2**20:.0f} MiB"
          + (f", decode step peak {peak / 2**20:.0f} MiB above its start" if device.type == "cuda" else ""))
    print(f"transformers generate: {theirs_total / a.max_tokens * 1e3:.1f} ms per token of every row")
    print(f"ratio transformers / ours (time per token): {theirs_total / ours_total:.2f}x")


if __name__ == "__main__":
    main()
