"""What a benchmark measures on a GPU besides time: each side's peak memory, and the bf16 peak its
FLOP rate is a share of (MFU)."""
from __future__ import annotations

from typing import Optional

def peak_flops(device: str) -> Optional[float]:
    """The GPU's dense bf16 peak, from the trainer's own table (grpojob.learner.flops)."""
    if device != "cuda":
        return None
    import torch

    from grpojob.learner.flops import peak_bf16

    return peak_bf16(torch.cuda.get_device_name())


class Memory:
    """Peak GPU memory of one side: its resident state (weights, gradients, optimizer) plus the
    largest rise above the memory in use when one of its steps began."""

    def __init__(self, cuda: bool):
        self.cuda, self.rise, self.start = cuda, 0, 0

    def begin(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            self.start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    def end(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
            self.rise = max(self.rise, torch.cuda.max_memory_allocated() - self.start)

    @staticmethod
    def state_bytes(model, optimizer) -> int:
        seen, total = set(), 0
        tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
        tensors += [t for s in optimizer.state.values() for t in s.values() if hasattr(t, "data_ptr")]
        for t in tensors:
            if t.is_cuda and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total
