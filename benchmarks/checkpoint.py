"""Checkpoints and weight pushes: the full-state path grpojob had against the sharded one, side by side.

N trainer ranks (gloo on the CPU, NCCL on GPUs) build the real GRPOTrainer on a locally built
random Qwen2 (benchmarks/trainer_throughput.py's shapes), take one optimizer step (AdamW state
exists), then alternate, round by round:
  full      the path before: the full model and optimizer state gathered on rank 0's host
            (torch's full state dicts, cpu_offload), rank 0 writes a Hugging Face model dir and
            a torch.save of the rest; loading reads them on rank 0 and broadcasts;
  sharded   grpojob.checkpoint: every rank stages its own shards and writes them with
            torch.distributed.checkpoint in the background (async_save), rank 0 commits; loading
            reads every rank's part where it is needed (DCP).
Figures (medians): save blocking time (until training could go on), total save time (until
committed), load time, and rank 0's peak memory during the save: the rise of its resident set
over the save (the kernel's high-water mark VmHWM, restarted through /proc/self/clear_refs after
glibc's freed pages went back with malloc_trim), and on CUDA the rise of its peak allocated GPU
memory. Then the same for a weight push to one
rollout receiver (a SyncAgent in its own process, discarding what arrives): the full state
dict gathered on rank 0 and pushed, against the stream gathered tensor by tensor into the
publisher's buckets (also printed: the most of the gathered weights alive at once). Pushes after
the first reuse the publisher's retained bucket buffers, as in a run; the first is a warm-up.

    python benchmarks/checkpoint.py                          # small shape, 2 gloo ranks, FSDP2 (a minute)
    python benchmarks/checkpoint.py --strategy ddp
    python benchmarks/checkpoint.py --device cuda --ranks 2 --shape qwen2.5-0.5b
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_throughput import SHAPES, build_model  # noqa: E402 - the benchmarks' shapes, one place
from weight_sync import DiscardSink  # noqa: E402 - the receiving end that drops what arrives

TOKEN = "benchmark-token"


class NoData:
    """Stands in for the rollout side's data position (no generation runs here: not measured)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class Peak:
    """Rank 0's rise over a span: resident host memory (VmHWM after a reset) and CUDA peak allocated."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def __enter__(self) -> "Peak":
        from grpojob.memory import reset_host_peak

        gc.collect()
        _trim()  # memory freed by the previous span goes back to the kernel: its pages would hide this one's rise
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.gpu0 = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rss0 = _rss()
        if not reset_host_peak():
            raise SystemExit("benchmarks/checkpoint.py: /proc/self/clear_refs cannot be written here")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        from grpojob.memory import host_peak_bytes

        self.seconds = time.perf_counter() - self.t0
        self.host = host_peak_bytes() - self.rss0
        self.gpu = None
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.gpu = torch.cuda.max_memory_allocated(self.device) - self.gpu0


def _trim() -> None:
    """glibc keeps freed heap pages resident (RSS would not rise again where an earlier span
    already touched them): hand them back first."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the rises are lower bounds then
        pass


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def job_doc(model: Path, a: argparse.Namespace) -> dict:
    return {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "bench"},
            "spec": {"model": {"path": str(model)}, "dataset": {"factory": "toy"}, "rewards": [{"name": "toy"}],
                     "training": {"steps": 10, "strategy": a.strategy},
                     "trainer": {"processesPerReplica": a.ranks},
                     "weightSync": {"bucketSizeMb": a.bucket_mb, "timeoutSeconds": 300},
                     "checkpoint": {"path": "unused", "resume": False}}}


# ---- the full-state path (as grpojob wrote and loaded checkpoints and pushed weights before) ----
def full_state(tr, optimizer: bool):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    multi = tr.env.world > 1
    msd = get_model_state_dict(tr.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=multi))
    osd = None
    if optimizer:
        osd = get_optimizer_state_dict(tr.policy, tr.optimizer,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=multi))
    return {k[len("model."):]: v for k, v in msd.items()}, osd


def save_full(tr, root: Path, step: int) -> Path:
    from grpojob.checkpoint import layout
    from grpojob.checkpoint.manager import rng_state
    from grpojob.learner import dist

    weights, optimizer = full_state(tr, optimizer=True)
    ranks = dist.gather_objects({"rng": rng_state()}, tr.env)
    final = layout.step_dir(root, step)
    if tr.env.is_leader:
        tmp = layout.temp_dir(root, step)
        tr.model.save_pretrained(tmp / layout.LEGACY_MODEL_DIR, state_dict=weights, safe_serialization=True)
        tr.tokenizer.save_pretrained(tmp / layout.LEGACY_MODEL_DIR)
        torch.save({"step": step, "policy_version": step, "optimizer": optimizer, "scheduler": tr.scheduler.state_dict(),
                    "ranks": ranks, "world": tr.env.world, "data": {}}, tmp / layout.STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    del weights, optimizer
    dist.barrier(tr.env)
    return final


# ---- one rank -----------------------------------------------------------------------------------
def rank_main(rank: int, a: argparse.Namespace, model: Path, work: Path, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), GRPOJOB_DEVICE=a.device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.ranks))
    from grpojob.api import parse
    from grpojob.checkpoint.manager import CheckpointManager
    from grpojob.checkpoint import layout
    from grpojob.learner import dist
    from grpojob.learner.trainer import GRPOTrainer

    env = dist.init(timeout_seconds=600)
    try:
        tr = GRPOTrainer(parse(job_doc(model, a)), env)
        for p in tr.policy.parameters():  # one optimizer step: AdamW's moments exist
            p.grad = torch.full_like(p, 1e-3)
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        mgr = CheckpointManager(work / "sharded", tr, keep_last=2, states={"scheduler": tr.scheduler, "data": NoData()})
        figures: dict[str, dict[str, list]] = {k: {} for k in ("full", "sharded")}

        def note(kind: str, **values) -> None:
            for k, v in values.items():
                figures[kind].setdefault(k, []).append(v)

        paths = {}
        for step in range(1, a.rounds + 1):
            for kind in ("full", "sharded"):
                dist.barrier(env)
                with Peak(env.device) as peak:
                    if kind == "full":
                        paths[kind] = save_full(tr, work / "full", step)
                        blocking = time.perf_counter() - peak.t0
                    else:
                        mgr.save()
                        blocking = time.perf_counter() - peak.t0
                        mgr.wait()
                        paths[kind] = layout.step_dir(work / "sharded", tr.step)  # the learner's step, as rank 0 committed it
                note(kind, save_blocking=blocking, save_total=peak.seconds, save_peak=peak.host, save_gpu=peak.gpu)
        for _ in range(a.rounds):
            for kind in ("full", "sharded"):
                dist.barrier(env)
                with Peak(env.device) as peak:
                    mgr.load(paths[kind])  # the full-state layout loads through checkpoint.legacy
                note(kind, load=peak.seconds, load_peak=peak.host)
        push_figures(tr, a, note)
        every = dist.gather_objects(figures, env)
        if env.is_leader:
            (work / "figures.json").write_text(json.dumps(every))
    finally:
        dist.shutdown(env)


def push_figures(tr, a: argparse.Namespace, note) -> None:
    from grpojob.api.spec import WeightSyncSpec
    from grpojob.rollout.engine import torch_dtype_name
    from grpojob.sync.publisher import WeightPublisher
    from grpojob.learner import dist

    env = tr.env
    serve = getattr(torch, torch_dtype_name(tr.spec.model.dtype, env.device.type == "cuda"))
    pub = receiver = None
    if env.is_leader:
        import multiprocessing as mp

        pub = WeightPublisher(WeightSyncSpec(bucket_size_mb=a.bucket_mb, timeout_seconds=300), host="127.0.0.1",
                              port=0, device=env.device, token=TOKEN, heartbeat_timeout=60)
        receiver = mp.get_context("spawn").Process(target=receive, args=(pub.port, a.device), daemon=True)
        receiver.start()
        while not pub.rollout_addresses():
            time.sleep(0.05)
    try:
        version = 0
        for round_ in range(a.rounds + 1):  # the first round warms the publisher's retained buffers up
            for kind in ("full", "sharded"):
                version += 1
                dist.barrier(env)
                with Peak(env.device) as peak:
                    if kind == "full":
                        state, _ = full_state(tr, optimizer=False)
                        state = {k: v.to(serve) if v.is_floating_point() else v for k, v in state.items()}
                        stats = pub.push(state.items(), version) if pub is not None else None
                        del state
                    else:
                        stream = tr.weight_stream(serve)
                        try:
                            stats = pub.push(stream, version) if pub is not None else None
                        finally:
                            stream.drain()
                if round_ > 0:
                    gathered = stats["gathered_peak_bytes"] if stats and kind == "sharded" else None
                    note(kind, push=peak.seconds, push_peak=peak.host, push_gpu=peak.gpu, push_gathered=gathered,
                         push_bytes=stats["bytes"] if stats else None)
    finally:
        if pub is not None:
            receiver.kill()
            receiver.join(timeout=30)
            pub.close()


def receive(port: int, device: str) -> None:
    from grpojob.sync.agent import SyncAgent

    torch.set_num_threads(1)
    SyncAgent(DiscardSink(device), f"127.0.0.1:{port}", token=TOKEN, replica="rx", url="http://rx",
              model_dir="unused").start()
    time.sleep(3600)  # until rank 0 ends it


# ---- the report ---------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="small")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--strategy", choices=["fsdp", "ddp"], default="fsdp",
                   help="the trainer's data parallelism (fsdp: each rank holds a shard; ddp: a replica)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bucket-mb", type=int, default=4,
                   help="weightSync.bucketSizeMb (a run's default is 256, for models of GBs)")
    a = p.parse_args()

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="grpojob-bench-ckpt-") as tmp:
        work = Path(tmp)
        model = build_model(a.shape, work / "model")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, args=(a, model, work, port), nprocs=a.ranks, join=True)
        ranks = json.loads((work / "figures.json").read_text())
        params = _params(model)
    mib = 2**20
    meds = [{k: {f: (statistics.median(v) if all(x is not None for x in v) else None) for f, v in d.items()}
             for k, d in fig.items()} for fig in ranks]
    med = meds[0]
    full, shard = med["full"], med["sharded"]
    for kind in ("full", "sharded"):  # the most any rank rose by (DDP: the replicas' writes are not rank 0's)
        med[kind]["save_peak_any"] = max(m[kind]["save_peak"] for m in meds)
    print(f"model: {a.shape} ({params / 1e6:.1f}M parameters, AdamW state), {a.ranks} ranks on {a.device} "
          f"({'NCCL' if a.device == 'cuda' else 'gloo'}), strategy {a.strategy}, medians of {a.rounds}")
    rows = [("save blocking (s)", "save_blocking", 1, "{:.3f}"), ("save total (s)", "save_total", 1, "{:.3f}"),
            ("load (s)", "load", 1, "{:.3f}"), ("rank-0 RSS rise during save (MiB)", "save_peak", mib, "{:.1f}"),
            ("largest rank's RSS rise during save (MiB)", "save_peak_any", mib, "{:.1f}"),
            ("rank-0 RSS rise during load (MiB)", "load_peak", mib, "{:.1f}"),
            ("rank-0 GPU peak rise during save (MiB)", "save_gpu", mib, "{:.1f}"),
            ("push (s)", "push", 1, "{:.3f}"), ("rank-0 RSS rise during push (MiB)", "push_peak", mib, "{:.1f}"),
            ("rank-0 GPU peak rise during push (MiB)", "push_gpu", mib, "{:.1f}"),
            ("gathered weights alive at once (MiB)", "push_gathered", mib, "{:.1f}")]
    print(f"{'':<40} {'full-state':>12} {'sharded':>12}")
    for label, key, unit, fmt in rows:
        cells = [fmt.format(d[key] / unit) if d.get(key) is not None else "-" for d in (full, shard)]
        if cells != ["-", "-"]:
            print(f"{label:<40} {cells[0]:>12} {cells[1]:>12}")
    print(f"pushed {shard['push_bytes'] / mib:.1f} MiB in buckets of {a.bucket_mb} MiB")
    print(json.dumps({"shape": a.shape, "ranks": a.ranks, "strategy": a.strategy, "device": a.device, **{
        f"{k}_{f}": v for k, d in med.items() for f, v in d.items()}}))
    print(f"rank-0 peak during push, streamed / full: {_ratio(shard['push_peak'], full['push_peak'])}")
    print(f"rank-0 peak during save, sharded / full: {_ratio(shard['save_peak'], full['save_peak'])}")


def _params(model: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        return sum(f.get_tensor(k).numel() for k in f.keys())


def _ratio(new: float, old: float) -> str:
    return f"{max(new, 0) / old:.2f}" if old > 0 else "n/a"


if __name__ == "__main__":
    main()
