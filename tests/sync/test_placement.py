"""Which path a push takes to each endpoint, and where impossible choices are refused (pure, plus
the shared-memory probe and one `grpojob run` that must refuse before starting anything)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from grpojob.sync.credentials import Credentials
from grpojob.sync.membership import Membership, Refused, Registration
from grpojob.sync.placement import (Endpoint, PlacementError, check_local_run, colocated_route, local, remove_probe,
                                    route, shares_memory, write_probe)

from ..rollout.harness import REPO

CPU = Endpoint("cpu", None, "node-a")
GPU_A = Endpoint("cuda", "GPU-aaaa", "node-a")
GPU_B = Endpoint("cuda", "GPU-bbbb", "node-b")


@pytest.mark.parametrize("trainer, server, shared, path", [
    (GPU_A, GPU_A, True, "cuda-ipc"),  # grpojob run on a one-GPU workstation
    (GPU_A, GPU_A, False, "gloo"),  # two pods sharing a GPU: no NCCL (one GPU), no IPC (no shared memory)
    (GPU_A, GPU_B, False, "nccl"),  # a cluster
    (GPU_A, GPU_B, True, "nccl"),  # two GPUs of one machine
    (GPU_A, CPU, True, "gloo"),
    (CPU, GPU_A, False, "gloo"),
    (CPU, CPU, True, "gloo"),
])
def test_auto_picks_by_placement(trainer, server, shared, path):
    assert route("auto", trainer, server, shared) == path


def test_auto_never_picks_nccl_for_one_gpu():
    assert {route("auto", GPU_A, GPU_A, shared) for shared in (True, False)} == {"cuda-ipc", "gloo"}


@pytest.mark.parametrize("backend, trainer, server, shared, message", [
    ("nccl", GPU_A, GPU_A, True, "nccl cannot connect two processes on one GPU (GPU-aaaa)"),
    ("nccl", CPU, GPU_A, False, "nccl needs a GPU at both ends, and the trainer computes on the CPU"),
    ("nccl", GPU_A, CPU, False, "nccl needs a GPU at both ends, and this endpoint computes on the CPU"),
    ("cuda-ipc", GPU_A, GPU_B, True, "cuda-ipc needs the endpoint on the trainer's GPU"),
    ("cuda-ipc", GPU_A, GPU_A, False, "cuda-ipc needs the trainer's host and IPC namespace"),
    ("shm", CPU, CPU, False, "shm needs the trainer's host and IPC namespace"),
])
def test_impossible_explicit_choices_are_refused_with_the_reason(backend, trainer, server, shared, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")):
        route(backend, trainer, server, shared)


@pytest.mark.parametrize("backend, trainer, server, shared", [
    ("nccl", GPU_A, GPU_B, False), ("cuda-ipc", GPU_A, GPU_A, True), ("shm", GPU_A, CPU, True),
    ("shm", CPU, CPU, True), ("gloo", GPU_A, GPU_A, False), ("checkpoint", CPU, GPU_B, False),
])
def test_possible_explicit_choices_are_kept(backend, trainer, server, shared):
    assert route(backend, trainer, server, shared) == backend


@pytest.mark.parametrize("backend, trainer, server, path", [
    ("auto", CPU, CPU, "shm"), ("auto", GPU_A, GPU_A, "cuda-ipc"), ("auto", GPU_A, CPU, "shm"),
    ("shm", GPU_A, GPU_A, "shm"), ("cuda-ipc", GPU_A, GPU_A, "cuda-ipc"),
])
def test_colocated_pushes_go_through_memory(backend, trainer, server, path):
    """spec.placement colocated: auto is shared memory on the CPU, CUDA IPC on the trainer's GPU."""
    assert colocated_route(backend, trainer, server, True) == path


@pytest.mark.parametrize("backend, shared, message", [
    ("auto", False, "placement colocated needs the engine in the trainer's pod"),
    ("gloo", True, "gloo copies the weights over the network"), ("nccl", True, "nccl copies the weights"),
    ("checkpoint", True, "checkpoint copies the weights over the network or through files"),
])
def test_colocated_refuses_network_paths(backend, shared, message):
    with pytest.raises(PlacementError, match=message):
        colocated_route(backend, CPU, CPU, shared)


def test_endpoints_travel_as_json_and_bad_ones_are_named():
    for ep in (CPU, GPU_A):
        assert Endpoint.from_json(ep.to_json()) == ep
    assert local("cpu") == Endpoint("cpu", None, socket.gethostname())
    for bad in ({"device": "tpu"}, {"device": "cuda"}, {}):
        with pytest.raises(ValueError, match="not an endpoint"):
            Endpoint.from_json(bad)


def test_the_probe_tells_who_shares_memory():
    probe = write_probe("testprobe")
    assert probe is not None and shares_memory(probe)
    assert not shares_memory({**probe, "token": "someone else's"})
    remove_probe(probe)
    assert not shares_memory(probe) and not shares_memory(None)


def test_registrations_get_a_route_per_endpoint_or_are_refused():
    def nccl(ep, shared):
        return route("nccl", GPU_A, ep, shared)
    creds = Credentials("token", "run1")
    members = Membership(None, "unused", creds, heartbeat_timeout=1, route=nccl, after_round=lambda: None)
    doc = {"instance": "v-1", "replica": "vllm-0", "url": "http://v", "shares_memory": False, "version": 0,
           "weights": "disk", "endpoints": [GPU_B.to_json(), Endpoint("cuda", "GPU-cccc").to_json()]}
    m = members.admit(Registration.parse({**doc, "proof": creds.prove(doc)}), 1)
    assert m.routes == ("nccl", "nccl") and m.replica == "vllm-0"
    doc["endpoints"].append(GPU_A.to_json())  # a tensor-parallel worker on the trainer's own GPU
    doc["instance"] = "v-2"
    with pytest.raises(Refused, match=r"spec.weightSync.backend: nccl cannot connect two processes on one GPU "
                                      r".*\[endpoint 2 \(GPU GPU-aaaa on node-a\)\]"):
        members.admit(Registration.parse({**doc, "proof": creds.prove(doc)}), 2)
    for broken in ({**doc, "endpoints": []}, {k: v for k, v in doc.items() if k != "url"}):
        with pytest.raises(Refused, match="malformed registration"):
            Registration.parse(broken)


def test_local_runs_refuse_what_one_machine_cannot_do():
    assert "share trainer rank 0's GPU" in check_local_run("nccl", 1)
    assert "this machine has none" in check_local_run("nccl", 0)
    assert "this machine has none" in check_local_run("cuda-ipc", 0)
    assert check_local_run("cuda-ipc", 1) is None and check_local_run("auto", 0) is None
    assert check_local_run("shm", 0) is None and check_local_run("gloo", 4) is None


def test_grpojob_run_refuses_an_impossible_backend_before_starting_anything(tmp_path):
    """The tests pin the CPU: no GPU for cuda-ipc, whatever this machine has."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(REPO / "examples" / "tiny-local.yaml"),
                           "--run-dir", str(run_dir), "--no-progress", "--set", "weightSync.backend=cuda-ipc",
                           "--set", f"model.path={tmp_path / 'no-model'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "spec.weightSync.backend: cuda-ipc needs a GPU, and this machine has none" in proc.stderr
    assert not (tmp_path / "no-model").exists() and not run_dir.exists()  # nothing built, nothing started
