"""Liger's fused Triton kernels (liger-kernel, when installed) in the policy's decoder on CUDA.

What is used: liger's documented model patching (`apply_liger_kernel_to_<model>`) for RMSNorm and
SwiGLU, on this model instance only: the patch also rebinds names in the model's transformers
module (its norm and MLP classes, its rotary function) for every model built later in the
process, an in-process rollout engine's included, so those names are put back right after. RoPE
is therefore left as it is (liger patches it only module-wide). Not its fused linear cross-entropy: that gives a loss (mean, or per token with
no temperature and no entropy), while the trainer needs each trained token's log-prob at the
sampling temperature and the entropy; the output layer stays learner.logprobs' tiled one.

The switch is no spec field: GRPOJOB_LIGER=1 or 0 forces it (benchmarks/trainer_throughput.py
--liger measures both); unset, it is on for CUDA when the package is importable. Patched layers
are not compiled (sizing.for_device): liger's kernels are the fusions torch.compile would make,
and the first step skips their compilation. A failure (no Triton for this GPU, an API change) logs once and leaves the
model as it was.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from typing import Optional

import torch
from torch import nn

log = logging.getLogger("grpojob.trainer")

ENV = "GRPOJOB_LIGER"
# model_type -> liger's documented patch function (all take rope/rms_norm/swiglu/cross-entropy
# switches and model=)
PATCHES = {"qwen2": "apply_liger_kernel_to_qwen2", "qwen3": "apply_liger_kernel_to_qwen3",
           "llama": "apply_liger_kernel_to_llama", "mistral": "apply_liger_kernel_to_mistral"}


def installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


def decide(device_type: str, setting: Optional[str], available: bool, model_type: str) -> tuple[bool, str]:
    """(use liger, why): GRPOJOB_LIGER's `setting` ("1", "0" or None), the device, whether the
    package imports and whether it has a patch for the model's family."""
    if setting not in (None, "", "0", "1"):
        return False, f"{ENV}={setting!r} is not 0 or 1: liger off"
    if setting == "0":
        return False, f"{ENV}=0"
    if device_type != "cuda":
        return False, "liger's kernels are Triton (CUDA)" + (f": {ENV}=1 ignored on {device_type}" if setting else "")
    if not available:
        return False, "liger-kernel is not installed" + (f" ({ENV}=1 asks for it)" if setting else "")
    if model_type not in PATCHES:
        return False, f"liger has no patch for model type {model_type!r} here"
    return True, f"liger kernels on ({ENV}={setting})" if setting else "liger kernels on (CUDA, installed)"


def _probe(device: torch.device) -> None:
    """Run each kernel once, forward and backward, on a small input: a GPU or Triton that cannot
    run them fails here, before the model is touched."""
    from liger_kernel.transformers.functional import liger_rms_norm, liger_swiglu

    # bf16 activations under float32 weights, as under autocast over float32 master weights
    x = torch.randn(8, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(64, device=device, dtype=torch.float32, requires_grad=True)
    a = torch.randn(8, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(8, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    total = liger_rms_norm(x, w, 1e-6).float().sum() + liger_swiglu(a, b).float().sum()
    total.backward()
    torch.cuda.synchronize(device)


def apply(model: nn.Module, device: torch.device) -> bool:
    """Patch `model` (a Hugging Face causal LM, before LoRA and compilation) with liger's kernels
    when decide() says so; True when they are in."""
    model_type = getattr(model.config, "model_type", "")
    use, why = decide(device.type, os.environ.get(ENV), installed(), model_type)
    if not use:
        (log.info if device.type == "cuda" else log.debug)("fused kernels: %s", why)
        return False
    module = importlib.import_module(type(model).__module__)  # e.g. transformers' modeling_qwen2
    names = dict(vars(module))
    try:
        _probe(device)
        patch = getattr(importlib.import_module("liger_kernel.transformers"), PATCHES[model_type])
        patch(rope=False, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
              model=model)
    except Exception as e:  # noqa: BLE001 - an optional speed-up: any failure falls back, once, loudly
        log.warning("fused kernels: liger-kernel failed (%s: %s); training with the model's own layers",
                    type(e).__name__, e)
        return False
    finally:  # this model's modules keep liger's forwards; the module's names are transformers' again
        for name, value in names.items():
            if vars(module).get(name) is not value:
                setattr(module, name, value)
    log.info("fused kernels: %s", why)
    return True
