"""Checkpoint save and restore on each storage choice, side by side (issue #56): a directory on
the local disk, a directory on tmpfs (/dev/shm: what any mounted directory costs at best, a
shared filesystem such as NFS adds its network), and an object store (moto's real S3 API on
127.0.0.1, tests/helpers/s3.py: the HTTP requests, signatures and multipart uploads of a real
store, without its network and disks). One trainer rank, the real GRPOTrainer and
CheckpointManager (asynchronous saves), AdamW state present.

Figures (medians of --rounds): save blocking (what the training loop waits), save total (until
committed: the marker put, or the rename), restore (the sharded state loaded into the trainer).
Then DCP's save and load alone through grpojob's store storage and through DCP's fsspec one.

    python benchmarks/checkpoint_storage.py                       # tiny model (seconds)
    python benchmarks/checkpoint_storage.py --shape qwen2.5-0.5b  # 0.5B, ~6 GB of state
    python benchmarks/checkpoint_storage.py --pods --strategy ddp # 2 trainer "pods" (torchrun --nnodes 2,
                                                                  # one rank each): one shared directory
                                                                  # against a directory per pod
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from checkpoint import NoData, job_doc  # noqa: E402 - the same job as the full/sharded benchmark
from trainer_throughput import SHAPES, build_model  # noqa: E402


def measure(tr, root, rounds: int) -> dict[str, float]:
    from grpojob.checkpoint.manager import CheckpointManager, find_latest

    mgr = CheckpointManager(root, tr, keep_last=2, states={"scheduler": tr.scheduler, "data": NoData()})
    out: dict[str, list[float]] = {"save_blocking": [], "save_total": [], "restore": []}
    for r in range(rounds):
        tr.step = r + 1
        mgr.save()
        mgr.wait()
        out["save_blocking"].append(mgr.last_save.blocking_seconds)
        out["save_total"].append(mgr.last_save.total_seconds)
        found = find_latest(root, tr.env)
        t = time.perf_counter()
        mgr.load(found)
        out["restore"].append(time.perf_counter() - t)
    mgr.close()
    return {k: statistics.median(v) for k, v in out.items()}


def writers(tr, url: str, rounds: int) -> dict[str, dict[str, float]]:
    """DCP's own save and load of the trainer's shards (synchronous, no commit) through our
    storage on obstore's native API against DCP's FsspecWriter/FsspecReader over obstore's fsspec
    adapter (in torch 2.13 a private module, torch.distributed.checkpoint._fsspec_filesystem: a
    comparison only, which is why grpojob has its own)."""
    from obstore.fsspec import register
    from obstore.store import from_url
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    from grpojob.checkpoint.store_dcp import StoreReader, StoreWriter

    register("s3")
    store = from_url(url, client_options={"allow_http": True})
    kinds = {"store_dcp (obstore native)": (lambda k: StoreWriter(store, k), lambda k: StoreReader(store, k)),
             "FsspecWriter (obstore fsspec)": (
                 lambda k: FsspecWriter(f"{url}/{k}", sync_files=False, client_options={"allow_http": True}),
                 lambda k: FsspecReader(f"{url}/{k}", client_options={"allow_http": True}))}
    out = {}
    for name, (writer, reader) in kinds.items():
        saves, loads = [], []
        for r in range(rounds):
            key = f"{name.split()[0]}-{r}"
            state = tr.sharded_state()
            t = time.perf_counter()
            dcp.save(state, storage_writer=writer(key), no_dist=True)
            saves.append(time.perf_counter() - t)
            t = time.perf_counter()
            try:
                dcp.load(state, storage_reader=reader(key), no_dist=True)
            except (Exception, dcp.CheckpointException) as e:  # noqa: BLE001 - the figure: it cannot restore
                loads.append(f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
                continue
            loads.append(time.perf_counter() - t)
        ok = [x for x in loads if not isinstance(x, str)]
        out[name] = {"save": statistics.median(saves), "load": statistics.median(ok) if len(ok) == len(loads) else
                     next(x for x in loads if isinstance(x, str))}
    return out


def trained(model: Path, a, env):
    from grpojob.api import parse
    from grpojob.learner.trainer import GRPOTrainer

    tr = GRPOTrainer(parse(job_doc(model, a)), env)
    for prm in tr.policy.parameters():
        prm.grad = torch.full_like(prm, 1e-3)
    tr.optimizer.step()
    tr.optimizer.zero_grad(set_to_none=True)
    return tr


def pod_worker(a) -> None:
    """One rank under torchrun: the figures of its checkpoint directory (BENCH_ROOT), rank 0 prints them."""
    from grpojob.learner import dist

    env = dist.init(timeout_seconds=300)
    try:
        tr = trained(Path(os.environ["BENCH_MODEL"]), a, env)
        figures = measure(tr, Path(os.environ["BENCH_ROOT"]), a.rounds)
        if env.is_leader:
            print("FIGURES " + json.dumps(figures), flush=True)
    finally:
        dist.shutdown(env)


def pods(a, work: Path) -> dict[str, dict[str, float]]:
    """2 pods x 1 rank: one directory both see (a ReadWriteMany claim), then one per pod (a claim each)."""
    import subprocess

    from grpojob.local.processes import free_port

    model, out = build_model(a.shape, work / "model"), {}
    for layout_name, roots in (("one shared directory (RWX)", [work / "shared"] * 2),
                               ("a directory per pod (RWO)", [work / "pod-0", work / "pod-1"])):
        port, procs = free_port(), []
        for node, root in enumerate(roots):
            env = {**os.environ, "BENCH_ROOT": str(root), "BENCH_MODEL": str(model), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT)])}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                 "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", __file__, "--pod-worker",
                 "--shape", a.shape, "--rounds", str(a.rounds), "--strategy", a.strategy],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=1800)[0] for p in procs]
        line = next((x for x in logs[0].splitlines() if x.startswith("FIGURES ")), None)
        if line is None:
            raise SystemExit(f"{layout_name}: no figures\n{logs[0][-3000:]}")
        written = sum(f.stat().st_size for r in set(roots) for f in r.rglob("*") if f.is_file()) / 2**20 / 2
        out[layout_name] = {**json.loads(line[len("FIGURES "):]), "mib_per_checkpoint": written}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pods", action="store_true", help="2 trainer pods: a shared directory against one per pod")
    p.add_argument("--strategy", choices=["fsdp", "ddp"], default="fsdp")
    p.add_argument("--pod-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.ranks, a.bucket_mb = 1, 4
    os.environ.setdefault("GRPOJOB_DEVICE", "cpu")
    if a.pod_worker:
        return pod_worker(a)
    if a.pods:
        with tempfile.TemporaryDirectory(prefix="grpojob-bench-pods-") as tmp:
            figures = pods(a, Path(tmp))
        print(f"model {a.shape}, 2 trainer pods x 1 rank ({a.strategy}), medians of {a.rounds}")
        print(f"{'':<28} {'save blocking (s)':>18} {'save total (s)':>15} {'restore (s)':>12} {'MiB written':>12}")
        for name, f in figures.items():
            print(f"{name:<28} {f['save_blocking']:>18.3f} {f['save_total']:>15.3f} {f['restore']:>12.3f} "
                  f"{f['mib_per_checkpoint']:>12.1f}")
        print(json.dumps({"shape": a.shape, "strategy": a.strategy, **figures}))
        return

    from grpojob.api import parse
    from grpojob.learner import dist
    from grpojob.learner.trainer import GRPOTrainer
    from tests.helpers import s3

    with tempfile.TemporaryDirectory(prefix="grpojob-bench-store-") as tmp, \
            tempfile.TemporaryDirectory(prefix="grpojob-bench-store-", dir="/dev/shm") as shm:
        work = Path(tmp)
        model = build_model(a.shape, work / "model")
        tr = GRPOTrainer(parse(job_doc(model, a)), dist.lone())
        for prm in tr.policy.parameters():
            prm.grad = torch.full_like(prm, 1e-3)
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        server = s3.start(work / "moto.log")
        try:
            os.environ.update(server.env())
            bucket = server.bucket()
            places = {"local disk": work / "ckpt", "tmpfs directory": Path(shm) / "ckpt",
                      "object store (moto S3)": f"s3://{bucket.name}/run"}
            figures = {name: measure(tr, root, a.rounds) for name, root in places.items()}
            storages = writers(tr, f"s3://{bucket.name}/dcp", a.rounds)
        finally:
            server.stop()
        size = sum(f.stat().st_size for f in (work / "ckpt").rglob("*") if f.is_file()) / 2**20 / 2
    print(f"model {a.shape}: one checkpoint {size:.1f} MiB (policy + AdamW state), 1 rank, medians of {a.rounds}")
    print(f"{'':<24} {'save blocking (s)':>18} {'save total (s)':>15} {'restore (s)':>12}")
    for name, f in figures.items():
        print(f"{name:<24} {f['save_blocking']:>18.3f} {f['save_total']:>15.3f} {f['restore']:>12.3f}")
    print(f"{'DCP storage on the store':<32} {'save (s)':>10} {'load (s)':>10}")
    for name, f in storages.items():
        load = f"{f['load']:>10.3f}" if isinstance(f["load"], float) else f"  {f['load']}"
        print(f"{name:<32} {f['save']:>10.3f} {load}")
    print(json.dumps({"shape": a.shape, "mib": round(size, 1), **figures, **storages}))


if __name__ == "__main__":
    main()
