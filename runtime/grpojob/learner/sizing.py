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
  (fewer, fuller launches), its width rounded up to a flex tile; every decoder layer compiled with
  torch.compile (fused norms, rotary, MLP) for dynamic widths, as flex attention and its mask are
  (attention._compiled: one compile for every width, not one per width), and the one-tile
  log-softmax of small vocabularies.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from grpojob.learner import attention
from grpojob.learner.packing import MicroBatch, TrainSeq, pack, tile_width

# A tile of the output layer's logits (learner.logprobs) holds at most this many float32 elements
# (64 MiB) by default; here, not there, since TrainShape sizes it per device and logprobs reads TrainShape.
TILE_ELEMENTS = 1 << 24

log = logging.getLogger("grpojob.trainer")


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
    head_tile: int = TILE_ELEMENTS  # logits per tile of the fused output layer (learner.logprobs)

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
                f"compile {self.compile or 'off'}, output-layer tiles of {self.head_tile:,} logits")


# Output-layer tiles on a GPU of at least BIG_TILE_MEMORY bytes: 8x the default (512 MiB of float32
# logits; forward and backward hold about four): at a 151,936-token vocabulary a tile is then
# 4,096 tokens instead of 512, 8x fewer of the tile loop's kernel launches per micro-batch.
BIG_TILE = TILE_ELEMENTS * 8
BIG_TILE_MEMORY = 40 * 2 ** 30
# On a CPU (host memory): 2x the default, 128 MiB of float32 logits, about 512 MiB in flight: a
# 49,152-token vocabulary (SmolLM2's) then fits 682 tokens in one tile, whose log-softmax needs no
# recompute in backward (learner.logprobs), where 341 would tile a micro-batch of a few hundred.
CPU_TILE = TILE_ELEMENTS * 2


def head_tile(device_memory: Optional[int]) -> int:
    """Logits per output-layer tile on a device of `device_memory` bytes (None: a CPU)."""
    if device_memory is None:
        return CPU_TILE
    return BIG_TILE if device_memory >= BIG_TILE_MEMORY else TILE_ELEMENTS


def for_device(device: torch.device, model: torch.nn.Module, fused: bool = False) -> TrainShape:
    """`fused`: liger's kernels are in the layers (learner.kernels): they are not compiled then."""
    param_dtype = next(model.parameters()).dtype
    if device.type == "cuda":
        bf16 = param_dtype == torch.float32 and torch.cuda.is_bf16_supported()
        return TrainShape(attention="flex", row_tokens=None, bucket=True,
                          compute_dtype=torch.bfloat16 if bf16 else None, compile=None if fused else "dynamic",
                          head_tile=head_tile(torch.cuda.get_device_properties(device).total_memory))
    big = sum(p.numel() for p in model.parameters()) >= CPU_COMPILE_PARAMS
    return TrainShape(attention="segments", row_tokens=None, bucket=False, compute_dtype=None,
                      compile="dynamic" if big else None, head_tile=head_tile(None))


# ---- micro-batch tokens from the device's free memory (CUDA, training.microBatchTokens unset) ----
# Bytes one packed token keeps alive for backward in one decoder layer, in multiples of the layer's
# widths: q, k, v, the attention output and o_proj's input, the MLP's gate, up, activation and
# product at the compute dtype; the norms' float32 inputs and the residuals at 4 bytes. SAFETY
# covers what the count leaves out (the compiler's and attention's temporaries, the allocator's
# fragmentation); SHARE leaves the rest of the free memory to whatever else grows on the device
# (an in-process engine's cache, the optimizer state before its first step).
SAFETY = 1.25
SHARE = 0.6
MAX_AUTO_TOKENS = 65_536
# A micro-batch's fixed cost (launches, the output layer's tiles, the Python around them) in
# tokens of work, traded against padding when choosing a step's micro-batch size (step_budget).
PER_MICRO_BATCH_TOKENS = 4096


def activation_bytes_per_token(hidden: int, intermediate: int, kv_width: int, layers: int,
                               compute_bytes: int = 2) -> int:
    per_layer = compute_bytes * (5 * hidden + 2 * kv_width + 4 * intermediate) + 4 * 4 * hidden
    return int(layers * per_layer * SAFETY)


def memory_cap(free_bytes: int, per_token_bytes: int, fixed_bytes: int, floor: int,
               ceiling: int = MAX_AUTO_TOKENS, share: float = SHARE) -> int:
    """The largest power-of-two micro-batch (tokens) whose activations fit in `share` of the free
    memory once `fixed_bytes` (state not allocated yet, the output layer's tiles) is set aside;
    never below `floor` (training.microBatchTokens: a sequence must fit) nor above `ceiling`."""
    usable = int(free_bytes * share) - fixed_bytes
    fits = usable // per_token_bytes if per_token_bytes > 0 else 0
    b = 1
    while b * 2 <= min(fits, ceiling):
        b *= 2
    return max(floor, b if fits >= 1 else 0)


def step_budget(tokens: int, floor: int, cap: int, per_micro_batch: int = PER_MICRO_BATCH_TOKENS) -> int:
    """The micro-batch budget for a step of `tokens` packed tokens: among `floor` and the powers of
    two up to `cap`, the one of least padded tokens (full micro-batches, the last one's width
    rounded up to a flex tile, packing.tile_width) plus `per_micro_batch` per micro-batch; ties go
    to the larger. Widths were powers of two while the layers compiled per shape: 37k tokens were
    then 77% padding in one 65,536-wide micro-batch; now fewer, fuller micro-batches win."""
    candidates = [floor] + [1 << k for k in range(1, 31) if floor < (1 << k) <= cap]
    best, best_cost = floor, None
    for b in candidates:
        full, rest = divmod(tokens, b)
        padded = full * b + min(b, tile_width(rest))  # tile_width(0) == 0
        cost = padded + (full + (1 if rest else 0)) * per_micro_batch
        if best_cost is None or cost <= best_cost:
            best, best_cost = b, cost
    return best


def cuda_cap(model: torch.nn.Module, device: torch.device, floor: int, trainable_params: int,
             head_tile_bytes: int) -> int:
    """memory_cap on a CUDA device now: free memory (the driver's, plus what this process's
    allocator holds unused), the model's widths, and what training has yet to allocate (float32
    gradients and AdamW's two moments of the trainable parameters, the output layer's gradient)."""
    cfg = model.config
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    kv = cfg.num_key_value_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    per_token = activation_bytes_per_token(cfg.hidden_size, cfg.intermediate_size, kv, cfg.num_hidden_layers)
    head = model.get_output_embeddings()
    fixed = 12 * trainable_params + 4 * head.weight.numel() + 4 * head_tile_bytes
    return memory_cap(free, per_token, fixed, floor)


class Budget:
    """A step's micro-batch token budget: training.microBatchTokens when the spec sets it or the
    trainer is not on CUDA; else sized per step (step_budget) under the free-memory cap, which
    `measure` gives once, at the first step (after the model, its reference and any in-process
    engine have taken their memory)."""

    def __init__(self, tokens: int, auto: bool, measure: Callable[[], int]):
        self.tokens, self.auto, self._measure = tokens, auto, measure
        self.cap: Optional[int] = None

    def for_step(self, seqs: Sequence[TrainSeq]) -> int:
        if not self.auto:
            return self.tokens
        if self.cap is None:
            self.cap = self._measure()
            log.info("micro-batch tokens: up to %d (from the device's free memory; training.microBatchTokens "
                     "unset, its %d the floor)", self.cap, self.tokens)
        return step_budget(sum(len(s.prompt_ids) + len(s.completion_ids) for s in seqs), self.tokens, self.cap)
