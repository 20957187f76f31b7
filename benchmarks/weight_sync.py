"""Weight sync: grpojob's bucketed push against two baselines, side by side in one run.

For a Qwen2-shaped state dict of the given size (random weights, built in memory on --device),
trainer rank 0 (this process) sends all weights to N receiver processes on the same device (the
`grpojob run` placement: one machine, one GPU or the CPU):
  ours        WeightPublisher.push over the path weightSync.backend (--backend, default auto)
              picks: gloo on the CPU, CUDA IPC on one GPU; flat dtype-grouped buckets
              (--bucket-mb), each receiver a real SyncAgent that acknowledges through the store;
  flat        (a) one gloo broadcast of all bytes at once, already packed: the limit of a
              collective on this machine;
  per-tensor  (b) one gloo broadcast per tensor, as TRL's vLLM server mode sends weights
              (without its extra HTTP call per tensor).
The methods take turns round by round (same machine load for each); every timing ends when all
receivers have everything (an acknowledgement for ours, a barrier for the baselines). Prints the
median seconds of each, GB/s, and the ratios ours/flat and per-tensor/ours.

    python benchmarks/weight_sync.py --layers 24 --hidden 256 --receivers 2 --rounds 7 [--device cuda]

With --delta it measures delta pushes instead (weightSync.delta): fp32 master weights take a real
AdamW step (--lr, default 1e-6) between pushes of their bf16 serving view, and the same view is
pushed by two publishers side by side, one with delta on and one with it off (each to its own
--receivers). It prints the fraction of values that changed, the bytes sent as a share of dense
and the push time as a ratio to the dense push (goals on the CPU: bytes <= 0.1 and time <= 0.5 at
lr 1e-6; time <= 1.05 at lr 3e-3, where most values change and buckets go whole).

    python benchmarks/weight_sync.py --delta [--lr 3e-3] [--device cuda] [--backend checkpoint]

With --backend checkpoint the versions go through files in a temporary directory (each receiver
reads every tensor of a whole version, or the changes of a delta version, as an engine that
declares delta_files does).

The defaults have the tensor count of Qwen2.5-0.5B (24 layers, 291 tensors) at 21M parameters.
Over loopback a message costs about 0.5 ms, so the per-tensor baseline loses most on models with
many small tensors, and packing (a memory copy competing with the transfer for the same cores)
costs most on large ones: try --hidden 128 and --hidden 512 as well.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time

import torch
from torch.distributed import BarrierOptions, BroadcastOptions, PrefixStore, ProcessGroupGloo, TCPStore

TIMEOUT = datetime.timedelta(seconds=300)
TOKEN = "benchmark-token"  # the job's token (grpojob.auth): the receivers prove it at registration


def state_dict(layers: int, hidden: int, vocab: int) -> dict[str, torch.Tensor]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      tie_word_embeddings=False)
    with torch.device("meta"):
        shapes = {n: (t.shape, t.dtype) for n, t in Qwen2ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g, dtype=torch.float32).to(d) for n, (s, d) in shapes.items()}


class DiscardSink:
    """Receives every push (the real receiver path) and drops it: the transfer is what is timed."""
    last_pause_seconds = None  # nothing generates here (the sink contract, sync.agent)

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.rx = None

    def endpoints(self):
        from grpojob.sync.placement import local
        return [local(self.device)]

    def receive_push(self, cmd, store_addr, instance):
        from grpojob.sync.receiver import PushReceiver
        if self.rx is None or self.rx.instance != instance:
            self.rx = PushReceiver(store_addr, instance, self.device)
        self.rx.receive(cmd)

    def load_dir(self, path, version, weights):
        """Backend checkpoint: read the version's tensors (a delta version's changes) and drop them."""
        from grpojob.sync import files, tensorfiles
        if files.is_delta(path):
            files.read_delta(path)
        else:
            for _ in tensorfiles.iter_dir(path):
                pass


def receiver(rank: int, world: int, bench_port: int, sync_port: int, shapes: list, rounds: list[str],
             device: str) -> None:
    from grpojob.sync.agent import SyncAgent

    torch.set_num_threads(1)
    agent = SyncAgent(DiscardSink(device), f"127.0.0.1:{sync_port}", token=TOKEN, replica=f"rx{rank}",
                      url=f"http://rx{rank}", model_dir="unused").start()
    store = TCPStore("127.0.0.1", bench_port, is_master=False, timeout=TIMEOUT)
    pg = ProcessGroupGloo(PrefixStore("bench", store), rank, world, TIMEOUT)
    total = sum(torch.Size(s).numel() * torch.empty((), dtype=getattr(torch, d)).element_size() for s, d in shapes)
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    tensors = [torch.empty(s, dtype=getattr(torch, d), device=device) for s, d in shapes]
    for i, kind in enumerate(rounds):
        store.wait([f"round/{i}"])
        if kind == "flat":
            pg.broadcast([flat], BroadcastOptions()).wait()
        elif kind == "per-tensor":
            for t in tensors:
                pg.broadcast([t], BroadcastOptions()).wait()
        pg.barrier(BarrierOptions()).wait()
    store.wait(["done"])  # the fixed-cost pushes come after the rounds
    agent.stop()


def delta_receiver(rank: int, sync_port: int, device: str, stop, checkpoint_dir) -> None:
    from grpojob.sync.agent import SyncAgent

    torch.set_num_threads(1)
    agent = SyncAgent(DiscardSink(device), f"127.0.0.1:{sync_port}", token=TOKEN, replica=f"rx{rank}",
                      url=f"http://rx{rank}", model_dir="unused", checkpoint_dir=checkpoint_dir,
                      delta_files=True).start()  # as the hf engine declares (backend checkpoint)
    stop.wait()
    agent.stop()


def delta_main(a, device: torch.device) -> None:
    """Delta pushes against dense pushes of the same serving view after each AdamW step."""
    from grpojob.api.spec import WeightSyncSpec
    from grpojob.sync.publisher import WeightPublisher

    master = {n: torch.nn.Parameter(t.float().to(device)) for n, t in state_dict(a.layers, a.hidden, a.vocab).items()}
    opt = torch.optim.AdamW(master.values(), lr=a.lr, weight_decay=0.0)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    pubs, procs, roots = {}, [], []
    for delta in (True, False):
        sync = WeightSyncSpec(backend=a.backend, timeout_seconds=300, bucket_size_mb=a.bucket_mb, delta=delta)
        root = tempfile.mkdtemp(prefix="grpojob-bench-") if a.backend == "checkpoint" else None
        roots += [root] if root else []
        pubs[delta] = WeightPublisher(sync, host="127.0.0.1", port=0, device=device, heartbeat_timeout=60, token=TOKEN,
                                      checkpoint_dir=root)
        procs += [ctx.Process(target=delta_receiver, args=(f"{int(delta)}-{r}", pubs[delta].port, str(device), stop,
                                                           root), daemon=True) for r in range(a.receivers)]
    for proc in procs:
        proc.start()
    try:
        while any(len(p.rollout_addresses()) < a.receivers for p in pubs.values()):
            time.sleep(0.05)
        times: dict[bool, list[float]] = {True: [], False: []}
        changed, sent, last = [], [], {}
        for version in range(1, a.rounds + 3):  # the first push is whole, the second the first delta
            loss = sum((p.float() * torch.randn_like(p)).sum() for p in master.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            view = {n: p.detach().to(torch.bfloat16) for n, p in master.items()}
            if version > 2:  # what the step changed, bit for bit, counted here (not by the code measured)
                changed.append(sum(int((view[n].view(torch.int16) != last[n].view(torch.int16)).sum())
                                   for n in view) / sum(t.numel() for t in view.values()))
            for delta in ((True, False) if version % 2 else (False, True)):  # take turns going first
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                stats = pubs[delta].push(view.items(), version=version)
                if version > 2:
                    times[delta].append(time.perf_counter() - start)
                    if delta:
                        sent.append(stats["delta"]["sent_bytes"] / stats["delta"]["dense_bytes"])
            last = view
        nbytes = stats["bytes"]
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"delta pushes: {len(master)} tensors, {nbytes / 2**20:.0f} MiB bf16 on {device}, {a.receivers} "
              f"receivers per publisher, AdamW lr {a.lr:g}, path {stats['backend']}, median of {a.rounds}")
        print(f"values changed per step:        {statistics.median(changed):.4f}")
        print(f"bytes sent / dense:              {statistics.median(sent):.4f}")
        total = sum(times[True]) / sum(times[False])  # counts the pushes that periodically re-try a delta too
        print(f"push seconds: delta {med[True]:.4f}, dense {med[False]:.4f}; all pushes' total, delta / dense: "
              f"{total:.2f}; delta / dense: {med[True] / med[False]:.2f}")
        print(json.dumps({"lr": a.lr, "device": str(device), "bytes": nbytes, "receivers": a.receivers,
                          "path": stats["backend"], "changed_fraction": statistics.median(changed),
                          "sent_fraction": statistics.median(sent), "delta_seconds": med[True],
                          "dense_seconds": med[False], "total_ratio": total, "ratio": med[True] / med[False]}))
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        for p in pubs.values():
            p.close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def fixed_cost(pub, device: torch.device, rounds: int, version: int) -> float:
    """Median seconds of a push of one 4 KiB tensor (after one warm-up push of that layout):
    what a push costs beyond its bytes (commands, acknowledgements, mappings)."""
    tiny = {"tiny.weight": torch.zeros(1024, device=device)}
    times = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        pub.push(tiny.items(), version=version + i)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def device_copy(flat: torch.Tensor, receivers: int, rounds: int) -> float:
    """Median seconds of `receivers` device-to-device copies of the packed bytes."""
    dst = [torch.empty_like(flat) for _ in range(receivers)]
    times = []
    for _ in range(rounds + 1):
        torch.cuda.synchronize(flat.device)
        start = time.perf_counter()
        for d in dst:
            d.copy_(flat)
        torch.cuda.synchronize(flat.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--bucket-mb", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: grpojob.devices.default())")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "shm", "cuda-ipc", "nccl", "checkpoint"],
                   help="weightSync.backend of ours (default auto: what a run picks)")
    p.add_argument("--delta", action="store_true", help="delta pushes after real AdamW steps, against dense")
    p.add_argument("--lr", type=float, default=1e-6, help="--delta: AdamW's learning rate")
    a = p.parse_args()

    from grpojob import devices
    from grpojob.api.spec import WeightSyncSpec
    from grpojob.sync.publisher import WeightPublisher

    device = torch.device(a.device) if a.device else devices.default()
    if a.delta:
        return delta_main(a, device)
    if a.backend == "checkpoint":
        p.error("--backend checkpoint: only with --delta (the dense comparison is against collectives)")
    sd = {n: t.to(device) for n, t in state_dict(a.layers, a.hidden, a.vocab).items()}
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"model: {len(sd)} tensors, {sum(t.numel() for t in sd.values()) / 1e6:.1f}M parameters, "
          f"{nbytes / 2**20:.0f} MiB on {device}; {a.receivers} receivers on {device}; buckets of {a.bucket_mb} MiB; "
          f"baselines over gloo on loopback")
    kinds = ["ours", "flat", "per-tensor"]
    schedule = ["warm-up-" + k for k in kinds] + kinds * a.rounds
    raw_rounds = [k.removeprefix("warm-up-") for k in schedule if k.removeprefix("warm-up-") != "ours"]

    sync = WeightSyncSpec(backend=a.backend, timeout_seconds=300, bucket_size_mb=a.bucket_mb)
    pub = WeightPublisher(sync, host="127.0.0.1", port=0, device=device, heartbeat_timeout=60, token=TOKEN)
    bench = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    world = a.receivers + 1
    shapes = [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in sd.values()]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=receiver, args=(r, world, bench.port, pub.port, shapes, raw_rounds, str(device)),
                         daemon=True) for r in range(1, world)]
    for proc in procs:
        proc.start()
    try:
        pg = ProcessGroupGloo(PrefixStore("bench", bench), 0, world, TIMEOUT)
        while len(pub.rollout_addresses()) < a.receivers:
            time.sleep(0.05)
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in sd.values()])
        times: dict[str, list[float]] = {k: [] for k in kinds}
        paths = set()
        raw_i = 0
        for version, kind in enumerate(schedule, start=1):
            base = kind.removeprefix("warm-up-")
            start = time.perf_counter()
            if base == "ours":
                stats = pub.push(sd.items(), version=version)
                assert stats["servers"] == a.receivers, stats
                paths.add(stats["backend"])
            else:
                bench.set(f"round/{raw_i}", "go")
                raw_i += 1
                if base == "flat":
                    pg.broadcast([flat], BroadcastOptions()).wait()
                else:
                    for t in sd.values():
                        pg.broadcast([t], BroadcastOptions()).wait()
                pg.barrier(BarrierOptions()).wait()
            if not kind.startswith("warm-up"):
                times[base].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"ours took the path: {', '.join(sorted(paths))} (weightSync.backend {a.backend})")
        print(f"{'method':<12} {'seconds':>9} {'GB/s':>7}   (median of {a.rounds})")
        for k in kinds:
            print(f"{k:<12} {med[k]:>9.4f} {nbytes / med[k] / 1e9:>7.2f}")
        print(f"ours / flat (goal <= 1.3):        {med['ours'] / med['flat']:.2f}")
        print(f"per-tensor / ours (goal >= 5):    {med['per-tensor'] / med['ours']:.2f}")
        fixed = fixed_cost(pub, device, a.rounds, version + 1)
        bench.set("done", "1")
        print(f"fixed cost (a push of one 4 KiB tensor to the same receivers): {fixed * 1e3:.2f} ms"
              + (" (goal <= 2 ms)" if device.type == "cuda" else ""))
        figures = {"tensors": len(sd), "bytes": nbytes, "receivers": a.receivers, "bucket_mb": a.bucket_mb,
                   "device": str(device), "path": sorted(paths), "median_seconds": med, "fixed_seconds": fixed}
        if device.type == "cuda":  # the floor: each receiver's copy of every byte, device to device
            copy = device_copy(flat, a.receivers, a.rounds)
            figures["device_copy_seconds"] = copy
            print(f"ratio device copy / ours: {copy / med['ours']:.2f} (each receiver's device-to-device copy of "
                  f"the {nbytes / 2**20:.0f} MiB: {copy * 1e3:.2f} ms; goal >= 0.5)")
        print(json.dumps(figures))
    finally:
        bench.set("done", "1")
        for proc in procs:  # they stop their agents after the last round, before the store goes
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        pub.close()


if __name__ == "__main__":
    main()
