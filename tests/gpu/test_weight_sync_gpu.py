"""Weight sync on GPUs, between real processes: NCCL across two GPUs, CUDA IPC on the trainer's
own GPU (what `grpojob run` does on a one-GPU workstation), and an explicit nccl refused there.
Skipped without CUDA (tests/conftest.py); these pin cuda."""
from __future__ import annotations

import json

import pytest
import torch

from grpojob.api.spec import WeightSyncSpec
from grpojob.sync.publisher import WeightPublisher

from ..rollout.harness import wait_for
from ..sync.peer import TOKEN, digest, reap, spawn, weights

SYNC = WeightSyncSpec(timeout_seconds=60, bucket_size_mb=1)


def _push_and_check(pub, out, replica, path):
    for version in (1, 2):  # the second push reuses the group or the mapped buffers
        w = {n: t.to(pub.device) for n, t in weights(version).items()}
        stats = pub.push(w.items(), version=version)
        assert stats["servers"] == 1 and stats["paths"] == {path: [replica]}, stats
        assert json.loads(out.read_text()) == {"version": version, "digest": digest(w)}
    assert pub.backend_in_use() == path


@pytest.mark.gpu(count=2)
def test_nccl_between_processes_on_two_gpus(tmp_path):
    out = tmp_path / "loaded.json"
    with WeightPublisher(SYNC, host="127.0.0.1", port=0, device="cuda:0", heartbeat_timeout=10, token=TOKEN) as pub:
        peer = spawn("serve", f"127.0.0.1:{pub.port}", "gpu1", "cuda:1", str(out), log_path=tmp_path / "peer.log")
        try:
            wait_for(lambda: pub.rollout_addresses(), 120, "the peer on cuda:1", proc=peer)
            assert pub.servers()[0]["routes"] == ["nccl"]
            _push_and_check(pub, out, "gpu1", "nccl")
        finally:
            reap(peer)


@pytest.mark.gpu
def test_cuda_ipc_between_processes_on_one_gpu(tmp_path):
    out = tmp_path / "loaded.json"
    with WeightPublisher(SYNC, host="127.0.0.1", port=0, device="cuda:0", heartbeat_timeout=10, token=TOKEN) as pub:
        peer = spawn("serve", f"127.0.0.1:{pub.port}", "same-gpu", "cuda:0", str(out), log_path=tmp_path / "peer.log")
        try:
            wait_for(lambda: pub.rollout_addresses(), 120, "the peer on cuda:0", proc=peer)
            assert pub.servers()[0]["routes"] == ["cuda-ipc"]  # auto never picks NCCL on one GPU
            _push_and_check(pub, out, "same-gpu", "cuda-ipc")
            free, _ = torch.cuda.mem_get_info(0)
            w = {n: t.cuda() for n, t in weights(3).items()}
            for version in range(3, 8):  # repeated pushes do not leak the mapped buffers
                pub.push(w.items(), version=version)
            assert torch.cuda.mem_get_info(0)[0] > free - 64 * 2**20
        finally:
            reap(peer)


@pytest.mark.gpu
def test_explicit_nccl_on_one_gpu_is_refused_naming_the_server(tmp_path):
    nccl = SYNC.model_copy(update={"backend": "nccl"})
    with WeightPublisher(nccl, host="127.0.0.1", port=0, device="cuda:0", heartbeat_timeout=10, token=TOKEN) as pub:
        peer = spawn("serve", f"127.0.0.1:{pub.port}", "same-gpu", "cuda:0", str(tmp_path / "x.json"),
                     log_path=tmp_path / "peer.log")
        try:
            reason = wait_for(lambda: pub.refused().get("same-gpu"), 120, "the refusal", proc=peer)
            assert reason.startswith("spec.weightSync.backend: nccl cannot connect two processes on one GPU")
            assert pub.rollout_addresses() == [] and pub.push(weights(1).items(), version=1)["servers"] == 0
            wait_for(lambda: "the trainer refused this server" in peer.log_path.read_text(), 30, "the peer's log")
        finally:
            reap(peer)


@pytest.mark.gpu
def test_twenty_delta_pushes_over_cuda_ipc_leave_the_receiver_bit_identical(tmp_path):
    """Delta pushes on the trainer's GPU (sync.delta: compared and applied on the device) to a
    receiver in another process: its bytes equal the trainer's serving view after every push."""
    from ..sync.test_delta import Trainer

    out, trainer = tmp_path / "loaded.json", Trainer(5)
    with WeightPublisher(SYNC, host="127.0.0.1", port=0, device="cuda:0", heartbeat_timeout=10, token=TOKEN) as pub:
        peer = spawn("serve", f"127.0.0.1:{pub.port}", "same-gpu", "cuda:0", str(out), log_path=tmp_path / "peer.log")
        try:
            wait_for(lambda: pub.rollout_addresses(), 120, "the peer on cuda:0", proc=peer)
            kinds = set()
            for version in range(1, 21):
                trainer.step(3e-2 if version % 7 == 0 else 1e-4)
                view = {n: t.cuda() for n, t in trainer.serving().items()}
                stats = pub.push(view.items(), version=version)
                assert stats["paths"] == {"cuda-ipc": ["same-gpu"]}, stats
                assert json.loads(out.read_text()) == {"version": version, "digest": digest(view)}
                kinds.add("delta" if stats["delta"]["delta_buckets"] else "dense")
            assert kinds == {"delta", "dense"}
        finally:
            reap(peer)


@pytest.mark.gpu
def test_delta_versions_on_files_from_a_gpu_trainer_leave_the_server_bit_identical(tmp_path):
    """Backend checkpoint from a trainer on CUDA: the version is kept and compared on the device
    (the device's way of sync.delta), the delta files written from there; a server that declares
    delta_files holds the trainer's serving view bit for bit after every version."""
    from grpojob.sync.agent import SyncAgent

    from ..sync.peer import SHAPES
    from ..sync.sinks import DeltaFileSink
    from ..sync.test_delta import Trainer, bitwise_equal

    trainer, sink = Trainer(6), DeltaFileSink(SHAPES)
    ckpt = SYNC.model_copy(update={"backend": "checkpoint"})
    with WeightPublisher(ckpt, host="127.0.0.1", port=0, device="cuda:0", heartbeat_timeout=10, token=TOKEN,
                         checkpoint_dir=str(tmp_path)) as pub:
        agent = SyncAgent(sink, f"127.0.0.1:{pub.port}", token=TOKEN, replica="files", url="http://files:1",
                          model_dir="x", checkpoint_dir=str(tmp_path), heartbeat_seconds=0.2, delta_files=True).start()
        try:
            wait_for(lambda: pub.rollout_addresses(), 60, "the server to register")
            for version in range(1, 11):
                trainer.step(1e-4)
                view = trainer.serving()
                pub.push({n: t.cuda() for n, t in view.items()}.items(), version=version)
                assert bitwise_equal(sink, view), f"version {version}"
            assert sink.kinds[0] == "whole" and set(sink.kinds[1:]) == {"delta"}
        finally:
            agent.stop()
