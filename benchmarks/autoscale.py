"""Autoscaling rollout servers (spec.rollout.autoscale): the same slow-generation job with the
autoscaler off (one rollout server, fixed) and on (1..--max-replicas), side by side in one
invocation, through the real `grpojob run` processes; then what a server stopped mid-generation
(as a scale-down stops it) keeps by draining.

The job is examples/plugins/paced/autoscale-paced.yaml with a constant pace: each completion holds
its rollout server --pace seconds, one request at a time, as a busy accelerator would (no CPU
burnt: on a 2-core machine more CPU servers would only share the same cores), and each update takes
--train-seconds more (a model worth training). So generation of a step's 32 completions takes
32 x pace on one server, 1/N of it on N.

    python benchmarks/autoscale.py [--steps 16] [--repeat 1] [--device cpu|cuda] [--max-seconds 150]

Prints, for each setting (fixed, autoscale; --repeat rounds taking turns, the median round
counting), over the steps after --warmup: the trainer's mean wait share (metrics.jsonl
wait_fraction), mean step time, the servers at the end and the autoscaler's changes; then the
ratios autoscale / fixed.

Then `cpu`: examples/autoscale.yaml as written (real hf generation on this machine's CPU cores, no
pacing) for --cpu-steps steps, fixed at 1 server and autoscaled (1..3), side by side: the whole
run's wall time of each, their ratio, and the autoscaler's changes. On a few shared cores more
servers do not make a step faster, so a scale-up must be undone (ScaleUpNoGain) and the autoscaled
run take about the fixed run's time.

Last, `drain`: a job at 2 servers whose second server gets SIGTERM while it generates; its log says
how many requests it had in flight, how many it finished (and their completion tokens) and how many
were cut off: what a scale-down without the drain threw away and generated again elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACED = ROOT / "examples" / "plugins" / "paced"
EXAMPLE = PACED / "autoscale-paced.yaml"
CPU_EXAMPLE = ROOT / "examples" / "autoscale.yaml"
DRAINED = re.compile(r"draining (\d+) requests in flight.*|drained in ([\d.]+) s: (\d+) requests finished "
                     r"\((\d+) completion tokens\), (\d+) cut off")


def run_one(workdir: Path, name: str, sets: list[str], args, on_step=None, example: Path = EXAMPLE) -> Path:
    from grpojob.local.runner import Run, prepare

    if example == EXAMPLE:
        sets = [f"training.steps={args.steps}", f"code.localPath={PACED}", f"trainer.args.secondsPerStep="
                f"{args.train_seconds}", 'rollout.engineArgs={"pace": [{"fromVersion": 0, "secondsPerCompletion": '
                '%s}]}' % args.pace, *sets]
    sets = [f"model.path={workdir / 'model'}", *sets]
    run_dir = workdir / name
    shutil.rmtree(run_dir, ignore_errors=True)
    job, run_dir = prepare(str(example), sets, str(run_dir), None, open(os.devnull, "w"))
    run = Run(job, run_dir, None, progress=False, out=open(os.devnull, "w"))
    stop = threading.Event()

    def watch():  # the time budget, and the drain part's signal
        began, seen = time.monotonic(), 0
        while not stop.wait(0.2):
            if args.max_seconds and time.monotonic() - began > args.max_seconds and run.interrupted is None:
                print(f"  {name}: --max-seconds {args.max_seconds:.0f} reached; stopping it", flush=True)
                run.interrupted = signal.SIGINT
            if on_step is not None:
                steps = _steps(run_dir)
                if steps > seen:
                    seen = steps
                    on_step(run, steps)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        code = run.run()
    finally:
        stop.set()
        watcher.join(2)
    if code != 0 and run.interrupted is None:
        sys.exit(f"{name}: grpojob run failed ({code}); logs in {run_dir / 'logs'}")
    return run_dir


def _steps(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in line)
    except FileNotFoundError:
        return 0


def summary(run_dir: Path, warmup: int) -> dict:
    from grpojob.local.progress import read_records

    records = [r for r in read_records(run_dir / "metrics.jsonl") if r.get("step")]
    steady = records[warmup:]
    if not steady:
        sys.exit(f"{run_dir.name}: only {len(records)} steps, none after --warmup {warmup}")
    log = run_dir / "autoscale.jsonl"
    changes = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {"wait": statistics.fmean(r["wait_fraction"] for r in steady),
            "step": statistics.fmean(r["step_seconds"] for r in steady),
            "train": statistics.fmean(r["stage_seconds"]["train"] for r in steady),
            "steps": f"{steady[0]['step']}..{steady[-1]['step']}", "servers": len(records[-1]["rollouts"]),
            "changes": ", ".join(f"{c['reason']} -> {c['replicas']} at step {c['step']}" for c in changes) or "none",
            "reward": records[-1]["reward_mean"]}


def cpu_bound(workdir: Path, args) -> dict:
    """examples/autoscale.yaml as written, fixed vs autoscaled, --repeat rounds taking turns: wall times."""
    settings = {"fixed": ["rollout.autoscale=null", "rollout.replicas=1"], "autoscale": []}
    rounds: dict[str, list[dict]] = {s: [] for s in settings}
    for i in range(args.repeat):
        for name, sets in settings.items():
            began = time.monotonic()
            run_dir = run_one(workdir, f"cpu-{name}", [f"training.steps={args.cpu_steps}", *sets], args,
                              example=CPU_EXAMPLE)
            r = {"wall": time.monotonic() - began, **summary(run_dir, args.warmup)}
            log = run_dir / "autoscale.jsonl"
            r["no_gain"] = log.read_text().count('"ScaleUpNoGain"') if log.exists() else 0
            rounds[name].append(r)
            print(f"round {i + 1} cpu {name}: wall {r['wall']:.1f}s  wait share {r['wait']:.3f}  step {r['step']:.2f}s"
                  f"  (changes: {r['changes']}; reward {r['reward']:.3f})", flush=True)
    return {s: sorted(rs, key=lambda r: r["wall"])[len(rs) // 2] for s, rs in rounds.items()}


def drain(workdir: Path, args) -> str:
    """Two fixed servers; rollout-1 gets SIGTERM once step --drain-step is recorded (generating the next)."""
    def on_step(run, steps):
        if steps == args.drain_step:
            next(c for c in run.children if c.name == "rollout-1").signal(signal.SIGTERM)
    run_dir = run_one(workdir, "drain", ["rollout.autoscale=null", "rollout.replicas=2",
                                         f"training.steps={args.drain_step + 3}"], args, on_step)
    found = [m.groups() for m in DRAINED.finditer((run_dir / "logs" / "rollout-1.log").read_text())]
    if len(found) < 2:
        return "rollout-1 had nothing in flight when it was stopped"
    inflight, (_, seconds, finished, tokens, cut) = found[0][0], found[1]
    group = json.loads((run_dir / "grpojob.json").read_text())["spec"]["algorithm"]["groupSize"]
    return (f"{inflight} requests in flight when stopped; drained in {seconds} s: {finished} finished there "
            f"({tokens} completion tokens kept), {cut} cut off and generated again elsewhere. Without the drain "
            f"all {inflight} were cut off and generated again ({int(inflight) * group} completions; the "
            f"{finished} finished held {tokens} tokens and {int(finished) * group * args.pace:.1f} s of server time)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4, help="steps left out (the autoscaler's servers start)")
    p.add_argument("--pace", type=float, default=0.1, help="seconds a completion holds its server")
    p.add_argument("--train-seconds", type=float, default=0.8, help="seconds each update takes more")
    p.add_argument("--max-replicas", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1, help="rounds; the median round of each setting counts")
    p.add_argument("--drain-step", type=int, default=3, help="the drain part stops a server after this step")
    p.add_argument("--no-drain", action="store_true", help="skip the drain part")
    p.add_argument("--cpu-steps", type=int, default=40, help="steps of the cpu part (examples/autoscale.yaml)")
    p.add_argument("--parts", default="paced,cpu", help="which of paced, cpu to run (the drain part: --no-drain)")
    p.add_argument("--max-seconds", type=float, default=150.0, help="stop a run after this long (0: never)")
    args = p.parse_args()
    os.environ["GRPOJOB_DEVICE"] = args.device
    settings = {"fixed": ["rollout.autoscale=null", "rollout.replicas=1"],
                "autoscale": ["rollout.replicas=1", "rollout.autoscale.minReplicas=1",
                              f"rollout.autoscale.maxReplicas={args.max_replicas}"]}
    rounds: dict[str, list[dict]] = {s: [] for s in settings}
    parts = set(args.parts.split(","))
    cpu = None
    with tempfile.TemporaryDirectory(prefix="grpojob-autoscale-") as tmp:
        for i in range(args.repeat if "paced" in parts else 0):
            for name, sets in settings.items():
                r = summary(run_one(Path(tmp), name, sets, args), args.warmup)
                rounds[name].append(r)
                print(f"round {i + 1} {name}: wait share {r['wait']:.3f}  step {r['step']:.2f}s  train stage "
                      f"{r['train']:.2f}s  (steps {r['steps']}, "
                      f"{r['servers']} servers at the end; changes: {r['changes']}; reward {r['reward']:.3f})",
                      flush=True)
        if "cpu" in parts:
            cpu = cpu_bound(Path(tmp), args)
        drained = None if args.no_drain else drain(Path(tmp), args)
    if "paced" in parts:
        res = {s: sorted(rs, key=lambda r: r["step"])[len(rs) // 2] for s, rs in rounds.items()}
        fixed, auto = res["fixed"], res["autoscale"]
        print(f"generation {32 * args.pace:.1f} s a step on one server (32 completions x {args.pace} s), training "
              f"+{args.train_seconds} s a step; device {args.device}")
        print(f"wait share: fixed {fixed['wait']:.3f}, autoscale {auto['wait']:.3f}: "
              f"{auto['wait'] / fixed['wait']:.2f}x (autoscale / fixed)")
        print(f"step time: fixed {fixed['step']:.2f}s, autoscale {auto['step']:.2f}s: "
              f"{auto['step'] / fixed['step']:.2f}x (steps/s {fixed['step'] / auto['step']:.2f}x)")
    if cpu:
        fixed, auto = cpu["fixed"], cpu["autoscale"]
        print(f"cpu ({CPU_EXAMPLE.name}, {args.cpu_steps} steps, {os.cpu_count()} cores): wall fixed {fixed['wall']:.1f}s, "
              f"autoscale {auto['wall']:.1f}s: {auto['wall'] / fixed['wall']:.2f}x; ScaleUpNoGain {auto['no_gain']}; "
              f"changes: {auto['changes']}")
    if drained:
        print(f"drain: {drained}")


if __name__ == "__main__":
    main()
