"""Peak host memory per stage, measured for real: the kernel's high-water mark of this process,
restarted at each stage boundary."""
import pytest
import torch

from grpojob.memory import StageMemory, host_peak_bytes, reset_host_peak


def test_each_stage_reports_its_own_peak():
    if not (reset_host_peak() and host_peak_bytes()):
        pytest.skip("/proc/self/clear_refs cannot be written on this kernel")
    mem = StageMemory(torch.device("cpu"))
    mem.mark(None)
    big = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, touched
    del big
    mem.mark("train")
    small = torch.ones(2**20)
    del small
    mem.mark("sync")
    host, device = mem.take()
    assert set(host) == {"train", "sync"} and device == {}
    assert host["train"] - host["sync"] >= 200 * 2**20, host  # the freed 256 MiB counted in train only
    assert mem.take() == ({}, {})
