"""Fixtures every layer shares: the tiny models, built once per test session (nothing from a hub), through
the per-user cache that `grpojob run` uses too (grpojob.tiny_cache: workers and later runs copy them).

Every test runs on the CPU unless it is marked `gpu`: GRPOJOB_DEVICE=cpu is set for this process
and the processes it starts, so a machine with a GPU runs the same tests the same way. A `gpu`
test pins cuda and is skipped where no CUDA device is visible.
"""
import os

# As in every process grpojob starts (grpojob.plan.THREAD_ENV), before torch loads OpenMP: idle OpenMP
# threads sleep instead of spinning, so the test processes and the servers and ranks they start share
# CI's 2 cores instead of spinning through each other's time slices (a 40-step `grpojob run` under load:
# 22-24 s passive against 48-68 s spinning).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from grpojob import tiny_cache
from grpojob.devices import ENV_DEVICE

os.environ[ENV_DEVICE] = "cpu"


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    gpus = None
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        gpus = _cuda_devices() if gpus is None else gpus
        need = int(marker.kwargs.get("count", 1))
        if gpus < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device(s), {gpus} visible"))


@pytest.fixture(autouse=True)
def _pin_device(request, monkeypatch):
    if request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setenv(ENV_DEVICE, "cuda")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return tiny_cache.build(build, tmp_path_factory.mktemp("models") / "tiny")[0]


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return tiny_cache.build(build, tmp_path_factory.mktemp("models") / "tiny-tied", tie_embeddings=True)[0]


@pytest.fixture(scope="session")
def tiny_sharp_dir(tmp_path_factory) -> Path:
    """The tiny model a LoRA user gets (`grpojob tiny --output-scale 10`, the annotation
    grpojob.io/build-tiny-model: "lora" of examples/tiny-lora.yaml): its output layer spans a
    pretrained model's logit range, which an adapter on the decoder needs (grpojob.tiny)."""
    from grpojob.tiny import LORA_OUTPUT_SCALE, build
    return tiny_cache.build(build, tmp_path_factory.mktemp("models") / "tiny-lora", output_scale=LORA_OUTPUT_SCALE)[0]


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_dir))
