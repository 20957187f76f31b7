"""Peak memory per step stage, of this process (the loop reports rank 0's).

Host: the kernel's high-water mark of the resident set (VmHWM in /proc/self/status), reset at each
stage boundary by writing "5" to /proc/self/clear_refs (Linux >= 4.0); where that file cannot be
written (a kernel or sandbox without it) host peaks are not reported, rather than made up. The
process's other threads (rollout manager, an in-process engine, a checkpoint being written in the
background) count in the stage they overlap. Device: torch.cuda's peak allocated bytes, reset the
same way (CUDA only)."""
from __future__ import annotations

import logging
from typing import Optional

import torch

log = logging.getLogger("grpojob.memory")

CLEAR_REFS = "/proc/self/clear_refs"
STATUS = "/proc/self/status"


def host_peak_bytes() -> Optional[int]:
    """VmHWM of this process in bytes (None where /proc has no such line)."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_host_peak() -> bool:
    """Restart the high-water mark at the current resident set; False where the kernel refuses."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StageMemory:
    """`mark(stage)` at the end of each stage: the peaks since the previous mark are that stage's.
    `take()` hands over the step's peaks ({stage: bytes} for host and device) and starts afresh."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.host = reset_host_peak() and host_peak_bytes() is not None
        if not self.host:
            log.info("peak host memory per stage is not reported here: %s cannot be written", CLEAR_REFS)
        self.host_peaks: dict[str, int] = {}
        self.device_peaks: dict[str, int] = {}

    def mark(self, stage: Optional[str]) -> None:
        """End `stage` (None: only restart the measurement)."""
        if self.host:
            if stage is not None:
                peak = host_peak_bytes()
                if peak is not None:
                    self.host_peaks[stage] = peak
            self.host = reset_host_peak()
        if self.cuda:
            if stage is not None:
                self.device_peaks[stage] = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        out = (self.host_peaks, self.device_peaks)
        self.host_peaks, self.device_peaks = {}, {}
        return out
