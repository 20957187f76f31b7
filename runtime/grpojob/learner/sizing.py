"""How the trainer runs on its device: precision, attention backend, row layout, compilation.

One place for these per-device choices (measured in benchmarks/trainer_throughput.py):

- CPU: float32; `segments` attention (no O(length^2) masks, no padding), so a micro-batch is one
  row holding up to training.microBatchTokens tokens. Models of CPU_COMPILE_PARAMS parameters or
  more get their decoder layers compiled with dynamic shapes (inductor's C++ kernels fuse norms,
  rotary and the MLP's elementwise work: about 8% of a train step of the benchmark's "small"
  shape, for 20-60 s of compilation in the first step), and so does the output layer's
  log-softmax (logprobs); smaller ones (the tiny model of tests and the local demo) run eagerly.
- CUDA: float32 master weights and optimizer state with bfloat16 autocast (unless spec.model.dtype
  pins another parameter dtype); `flex` attention with block masks; one row per micro-batch
  (fewer, fuller launches), its width bucketed to powers of two so that each compiled shape is
  reused; every decoder layer compiled with torch.compile (fused norms, rotary, MLP), and the
  one-tile log-softmax of small vocabularies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from grpojob.learner import attention
from grpojob.learner.packing import MicroBatch, TrainSeq, pack


def master_dtype(name: str) -> torch.dtype:
    """The trainer's parameter dtype for spec.model.dtype: auto keeps float32 master weights on
    every device (bf16 on GPU is the compute dtype, see TrainShape.compute_dtype)."""
    return torch.float32 if name == "auto" else getattr(torch, name)


CPU_COMPILE_PARAMS = 2_000_000


@dataclass(frozen=True)
class TrainShape:
    attention: str  # attention.BACKENDS
    row_tokens: Optional[int]  # row capacity; None: the whole micro-batch budget (one row)
    bucket: bool  # pad micro-batch shapes to powers of two
    compute_dtype: Optional[torch.dtype]  # autocast dtype, None: the parameters' dtype
    compile: Optional[str]  # None, "static" (bucketed shapes) or "dynamic" (symbolic lengths)

    def pack(self, seqs: Sequence[TrainSeq], budget: int, pad_id: int) -> list[MicroBatch]:
        return pack(seqs, budget, row_tokens=self.row_tokens or budget, pad_id=pad_id, bucket=self.bucket)

    def prepare(self, model: torch.nn.Module) -> None:
        """Point a transformers causal LM at this shape's attention, and compile its layers."""
        attention.install(model, self.attention)
        if self.compile:
            for layer in getattr(model.base_model, "layers", []):
                layer.compile(dynamic=self.compile == "dynamic")

    def describe(self) -> str:
        rows = f"rows of {self.row_tokens}" if self.row_tokens else "one row per micro-batch"
        return (f"attention {self.attention}, {rows}{', bucketed' if self.bucket else ''}, "
                f"compute {str(self.compute_dtype or 'as parameters').replace('torch.', '')}, "
                f"compile {self.compile or 'off'}")


def for_device(device: torch.device, model: torch.nn.Module) -> TrainShape:
    param_dtype = next(model.parameters()).dtype
    if device.type == "cuda":
        bf16 = param_dtype == torch.float32 and torch.cuda.is_bf16_supported()
        return TrainShape(attention="flex", row_tokens=None, bucket=True,
                          compute_dtype=torch.bfloat16 if bf16 else None, compile="static")
    big = sum(p.numel() for p in model.parameters()) >= CPU_COMPILE_PARAMS
    return TrainShape(attention="segments", row_tokens=None, bucket=False, compute_dtype=None,
                      compile="dynamic" if big else None)
