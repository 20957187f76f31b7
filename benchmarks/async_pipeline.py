"""The async pipeline: the same job at algorithm.maxStaleness 0 (the synchronous baseline), 1 and 2,
side by side in one run, through the real `grpojob run` processes (a trainer under torchrun and an
hf rollout server, weights pushed every step over the weight-sync group).

On the CPU each process gets a core of its own (taskset, one torch thread each), standing in for
a trainer GPU and a rollout GPU; the job is sized so that generating a step's groups and training
on them take about the same time (both are printed: adjust --max-tokens / --epochs until they are
close). With staleness 0 the two take turns; from 1 on, the rollout server generates step n+1
while the trainer trains step n.

    python benchmarks/async_pipeline.py [--steps 40] [--device cpu|cuda]

The settings take turns (0, 1, 2, 0, 1, 2, ... for --repeat rounds) so that a busy machine weighs on
each alike; per staleness the median round counts. Prints, per staleness, steps/s over the steps
after warm-up, the trainer's mean wait for groups,
its train time, the generation time measured at staleness 0, the rollout idle fraction and the
mean policy lag, each run's ratio to staleness 0, and closes with
`async speedup (staleness 1 / 0): N.NNx`. Goal: >= 1.6x.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-local.yaml"


def run_one(workdir: Path, staleness: int, args) -> list[dict]:
    from grpojob.local.progress import read_records
    from grpojob.local.runner import Run, prepare

    sets = [f"algorithm.maxStaleness={staleness}", f"training.steps={args.steps}",
            f"training.promptsPerStep={args.prompts}", f"algorithm.groupSize={args.group}",
            f"algorithm.epochs={args.epochs}", f"rollout.sampling.maxTokens={args.max_tokens}",
            "checkpoint.everySteps=100000", f"model.path={workdir / 'model'}"]
    run_dir = workdir / f"staleness-{staleness}"
    shutil.rmtree(run_dir, ignore_errors=True)
    job, run_dir = prepare(str(EXAMPLE), sets, str(run_dir), None, open(os.devnull, "w"))
    run = Run(job, run_dir, None, progress=False, out=open(os.devnull, "w"))
    for child in run.children:
        child.env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        if args.device == "cpu" and shutil.which("taskset") and os.cpu_count() >= 2:
            core = "0" if child.name.startswith("trainer") else "1"
            child.argv = ["taskset", "-c", core, *child.argv]
    code = run.run()
    if code != 0:
        sys.exit(f"staleness {staleness}: grpojob run failed ({code}); logs in {run_dir / 'logs'}")
    return read_records(run_dir / "metrics.jsonl")


def summary(records: list[dict], warmup: int) -> dict:
    steady = records[warmup:]
    span = steady[-1]["time"] - records[warmup - 1]["time"]
    mean = lambda key: statistics.fmean(r[key] for r in steady if r.get(key) is not None)  # noqa: E731
    return {"steps_per_s": len(steady) / span, "wait": mean("wait_seconds"),
            "train": statistics.fmean(r["stage_seconds"]["train"] for r in steady),
            "sync": mean("sync_seconds"), "idle": mean("rollout_idle_fraction"),
            "lag": mean("policy_staleness"), "reward": records[-1]["reward_mean"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--epochs", type=int, default=2, help="optimisation passes per step (the train time)")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--repeat", type=int, default=3, help="rounds; the median round of each setting counts")
    args = p.parse_args()
    os.environ["GRPOJOB_DEVICE"] = args.device
    rounds: dict[int, list[dict]] = {s: [] for s in args.staleness}
    with tempfile.TemporaryDirectory(prefix="grpojob-async-") as tmp:
        for i in range(args.repeat):
            for s in args.staleness:
                r = summary(run_one(Path(tmp), s, args), args.warmup)
                rounds[s].append(r)
                print(f"round {i + 1} staleness {s}: {r['steps_per_s']:.2f} steps/s  wait {r['wait']:.3f}s  "
                      f"train {r['train']:.3f}s  sync {r['sync']:.3f}s  rollout idle {r['idle']:.0%}  "
                      f"lag {r['lag']:.2f}  reward {r['reward']:.3f}", flush=True)
    results = {s: sorted(rs, key=lambda r: r["steps_per_s"])[len(rs) // 2] for s, rs in rounds.items()}
    base = results[args.staleness[0]]
    print(f"generate (the trainer's wait at staleness {args.staleness[0]}) {base['wait']:.3f}s vs train "
          f"{base['train']:.3f}s per step")
    for s, r in results.items():
        print(f"staleness {s} / {args.staleness[0]}: {r['steps_per_s'] / base['steps_per_s']:.2f}x")
    if 0 in results and 1 in results:
        print(f"async speedup (staleness 1 / 0): {results[1]['steps_per_s'] / results[0]['steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
