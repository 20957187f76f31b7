"""Rules a GPU enforces on process groups, pinned on the CPU.

NCCL carries CUDA tensors only: a default group of NCCL alone fails every collective on a CPU tensor
("No backend type associated with device type cpu") and DCP's asynchronous save asserts "A CPU
backend must be enabled for async save" (torch.distributed.checkpoint.state_dict_saver). A group
made with backend "cuda:gloo" is exactly such a group on a machine without NCCL: no CPU backend.
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as tdist

from grpojob import checkpoint
from grpojob.local.processes import free_port
from grpojob.learner import dist
from grpojob.leader.build import build

from .conftest import make_job


def test_the_default_group_on_gpus_has_a_cpu_backend_beside_nccl():
    assert dist.backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert dist.backend(torch.device("cpu")) == "gloo"


@pytest.fixture
def group_without_cpu_backend(monkeypatch):
    """A one-rank default group that, like NCCL's, has no CPU backend (destroyed afterwards)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    tdist.init_process_group("cuda:gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            tdist.all_reduce(torch.zeros(1))  # what NCCL alone does with a CPU tensor
        yield dist.DistEnv(rank=0, world=1, initialized=True)
    finally:
        tdist.destroy_process_group()


def test_the_group_handed_to_dcp_has_a_cpu_backend_whenever_a_process_group_exists(
        tiny_dir, tmp_path, group_without_cpu_backend):
    """One rank on one GPU: the README's job died at its first checkpoint when the manager left
    DCP the (NCCL-only) default group. The manager's own gloo group saves, asynchronously."""
    env = group_without_cpu_backend
    assert not dist.has_cpu_backend()
    run = build(make_job(tiny_dir, training={"steps": 1}), env=env, checkpoint_dir=str(tmp_path / "ck"))
    try:
        mgr = run.checkpoints
        assert mgr.pg is not None and dist.has_cpu_backend(mgr.pg)
        mgr.save()
        mgr.wait()
        assert checkpoint.latest(tmp_path / "ck").name == "step-000000"
        again = build(make_job(tiny_dir, training={"steps": 1}), env=env, checkpoint_dir=str(tmp_path / "ck"))
        assert again.resumed_from == tmp_path / "ck" / "step-000000"  # and it loads through the same group
        again.close()
    finally:
        run.close()


def test_a_run_that_ends_waits_for_its_save_in_flight(tiny_dir, tmp_path):
    """The benchmark that drove the loop step by step ended with `.metadata.tmp` missing: its work
    directory went while an asynchronous save was still writing into it. close() commits it."""
    run = build(make_job(tiny_dir, training={"steps": 1}), checkpoint_dir=str(tmp_path / "ck"))
    run.checkpoints.save()
    run.close()
    assert run.checkpoints.pending is None
    assert checkpoint.latest(tmp_path / "ck").name == "step-000000"


def test_a_lone_trainer_computes_on_the_device_grpojob_devices_names(tiny_dir, tmp_path, monkeypatch):
    """`trainer_throughput.py --device cuda` trained (and generated) on the CPU: build() without a
    process group took a DistEnv on the CPU whatever GRPOJOB_DEVICE said. Now a lone trainer
    follows grpojob.devices: pinned to cuda it runs there, or is refused where there is none."""
    from grpojob.devices import DeviceError

    monkeypatch.setenv("GRPOJOB_DEVICE", "cuda")
    if torch.cuda.is_available():
        run = build(make_job(tiny_dir, training={"steps": 1}), checkpoint_dir=str(tmp_path / "ck"))
        assert run.trainer.env.device.type == "cuda"
        run.close()
    else:
        with pytest.raises(DeviceError, match="no CUDA device is visible"):
            build(make_job(tiny_dir, training={"steps": 1}), checkpoint_dir=str(tmp_path / "ck"))
