"""Atropos's weight-bridge modes on one job, side by side (docs/modes.md maps the names):

  separate full     rollout server and trainer in processes of their own, full weights pushed
                    (the baseline every ratio is against)
  separate lora     the same with spec.model.lora: only the adapter is trained and pushed
  colocated full    spec.placement colocated: the engine sleeps while the trainer trains and the
                    push goes through memory (shm on CPU, CUDA IPC on a GPU)
  colocated lora    both

Each mode is the same GRPOJob run with `grpojob run` (the toy task on a locally built random Qwen2
of one of trainer_throughput.py's shapes, the hf engine), the modes taking turns round by round so
each sees the same load on a shared machine. Figures per mode: optimizer steps per second (the
median step time after the first, warm-up, step), bytes and tensors per weight push (the step
records' sync_bytes and sync_tensors), and the job's peak memory: the sum of the resident sets of
all of the run's processes, sampled every 0.2 s over the process tree (on CUDA also the sum of their GPU memory, from
nvidia-smi). It ends with the adapter's share of a full push.

    python benchmarks/modes.py                                   # tiny shape, CPU (a few minutes)
    python benchmarks/modes.py --shape small --rank 8            # about 6.8M parameters
    python benchmarks/modes.py --device cuda --shape qwen2.5-0.5b --rank 16
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_throughput import SHAPES, build_model  # noqa: E402 - the benchmarks' shapes, one place

MODES = {"separate full": ("separate", False), "separate lora": ("separate", True),
         "colocated full": ("colocated", False), "colocated lora": ("colocated", True)}
BASELINE = "separate full"


def job_doc(model: Path, placement: str, lora: bool, a: argparse.Namespace) -> dict:
    _, sizes = SHAPES[a.shape]
    spec = {"model": {"path": str(model)}, "placement": placement,
            "dataset": {"factory": "toy", "maxPromptLength": 32}, "rewards": [{"name": "toy"}],
            "algorithm": {"name": "grpo", "groupSize": a.group},
            "training": {"steps": a.steps, "promptsPerStep": a.prompts, "learningRate": a.lr,
                         "microBatchTokens": sizes["micro_batch_tokens"]},
            "rollout": {"backend": "hf", "sampling": {"maxTokens": a.max_tokens}},
            "checkpoint": {"path": "checkpoints", "everySteps": 10_000}}
    if lora:
        spec["model"]["lora"] = {"rank": a.rank, "alpha": 2 * a.rank}
        spec["training"]["learningRate"] = a.lora_lr
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "modes"}, "spec": spec}


class GroupMemory:
    """Peak of the summed resident sets (and GPU memory) of a process and all its descendants
    (`grpojob run` starts its children in sessions of their own: a process group misses them)."""

    def __init__(self, root: int, cuda: bool):
        self.root, self.cuda = root, cuda
        self.host_peak = self.gpu_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _pids(self) -> list[int]:
        parent = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])  # ppid, after the command name
        tree, grew = {self.root}, True
        while grew:
            new = {pid for pid, pp in parent.items() if pp in tree and pid not in tree}
            tree |= new
            grew = bool(new)
        return sorted(tree)

    def _sample(self) -> None:
        pids = self._pids()
        rss = 0
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
            except OSError:
                pass
        self.host_peak = max(self.host_peak, rss)
        if self.cuda:
            q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
            used = sum(int(m) * 2**20 for p, m in (x.split(", ") for x in q.stdout.strip().splitlines() if x)
                       if int(p) in pids)
            self.gpu_peak = max(self.gpu_peak, used)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_mode(name: str, model: Path, a: argparse.Namespace, work: Path) -> dict:
    from grpojob.local.progress import read_records

    placement, lora = MODES[name]
    d = work / name.replace(" ", "-")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "job.yaml").write_text(yaml.safe_dump(job_doc(model, placement, lora, a)))
    env = {**os.environ, "GRPOJOB_DEVICE": a.device}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "grpojob", "run", "job.yaml", "--run-dir", "run", "--no-progress"],
                            cwd=d, env=env, stdout=open(d / "out.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    memory = GroupMemory(proc.pid, a.device == "cuda")
    code = proc.wait()
    memory.stop()
    wall = time.perf_counter() - t0
    if code != 0:
        sys.exit(f"{name}: grpojob run exited {code}:\n" + (d / "out.log").read_text()[-4000:])
    records = read_records(d / "run" / "metrics.jsonl")
    pushes = [r for r in records if r.get("sync_bytes")]
    return {"mode": name, "steps_per_s": 1.0 / statistics.median(r["step_seconds"] for r in records[1:]),
            "push_bytes": statistics.median(r["sync_bytes"] for r in pushes) if pushes else 0,
            "push_tensors": statistics.median(r["sync_tensors"] for r in pushes) if pushes else 0,
            "host_peak": memory.host_peak, "gpu_peak": memory.gpu_peak, "wall_s": wall,
            # the trainer process's own peak (its step records: rank 0's resident set per stage),
            # to tell the trainer's share of host_peak from the rollout server's
            "trainer_host_peak": max((max(r.get("stage_host_peak_bytes", {}).values(), default=0) for r in records),
                                     default=0),
            "reward_first": records[0]["reward_mean"], "reward_last": records[-1]["reward_mean"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha = 2 x rank, all linear layers)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1, help="runs of each mode, taking turns; medians reported")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=None, help="default: the shape's completion length")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lora-lr", type=float, default=1e-2)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), metavar="MODE")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args()
    if a.max_tokens is None:
        a.max_tokens = min(SHAPES[a.shape][1]["max_tokens"], 32)
    work = Path(tempfile.mkdtemp(prefix="grpojob-modes-"))
    try:
        model = build_model(a.shape, work / "model")
        rows: dict[str, list[dict]] = {m: [] for m in a.modes}
        for rnd in range(a.rounds):
            for m in a.modes:
                r = run_mode(m, model, a, work)
                rows[m].append(r)
                print(json.dumps({"round": rnd, **r}), flush=True)
        med = {m: {k: (statistics.median(x[k] for x in rs) if k != "mode" else m) for k in rs[0]}
               for m, rs in rows.items()}
        base = med.get(BASELINE)
        print(f"\n{a.shape} on {a.device}, LoRA rank {a.rank}, {a.steps} steps, medians of {a.rounds} round(s); "
              f"ratios against {BASELINE}")
        print(f"{'mode':16} {'steps/s':>8} {'ratio':>6} {'push MiB':>9} {'ratio':>6} {'tensors':>7} "
              f"{'host peak MiB':>13} {'ratio':>6} {'trainer MiB':>11} {'ratio':>6}" + (f" {'GPU peak MiB':>12} {'ratio':>6}" if a.device == "cuda" else ""))
        for m, r in med.items():
            def ratio(k):
                return f"{r[k] / base[k]:6.2f}" if base and base[k] else "     -"
            line = (f"{m:16} {r['steps_per_s']:8.3f} {ratio('steps_per_s')} {r['push_bytes'] / 2**20:9.3f} "
                    f"{ratio('push_bytes')} {r['push_tensors']:7.0f} {r['host_peak'] / 2**20:13.0f} {ratio('host_peak')} "
                    f"{r['trainer_host_peak'] / 2**20:11.0f} {ratio('trainer_host_peak')}")
            if a.device == "cuda":
                line += f" {r['gpu_peak'] / 2**20:12.0f} {ratio('gpu_peak')}"
            print(line)
        pairs = [(f"{pl} lora", f"{pl} full") for pl in ("separate", "colocated")]
        shares = [med[lo]["push_bytes"] / med[fu]["push_bytes"] for lo, fu in pairs
                  if lo in med and fu in med and med[fu]["push_bytes"]]
        if shares:
            print(f"lora push bytes / full push bytes: {max(shares):.3f}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")


if __name__ == "__main__":
    main()
