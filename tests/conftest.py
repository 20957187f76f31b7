"""Fixtures every layer shares: the tiny models, built once per test session (nothing from a hub).

Every test runs on the CPU unless it is marked `gpu`: GRPOJOB_DEVICE=cpu is set for this process
and the processes it starts, so a machine with a GPU runs the same tests the same way. A `gpu`
test pins cuda and is skipped where no CUDA device is visible.
"""
import os
from pathlib import Path

import pytest

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
    return build(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory) -> Path:
    from grpojob.tiny import build
    return build(tmp_path_factory.mktemp("models") / "tiny-tied", tie_embeddings=True)


@pytest.fixture(scope="session")
def tiny_sharp_dir(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model with its output layer scaled x10, for LoRA. A random model's logits (weights
    of std 0.02) span about +-1.3, so its next-token distribution stays near uniform whatever the
    hidden state; only the output layer and the final norm, which LoRA on the decoder's linear
    layers leaves alone, could sharpen it. A pretrained model's logits span tens: this gives the
    tiny model that range, so that an adapter can steer what it says."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("models") / "tiny-sharp"
    shutil.copytree(tiny_dir, out)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_dir))
