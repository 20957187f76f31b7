"""The GRPO trainer: the step loop (loop.Trainer), packing, distributed data parallelism, the
leader endpoint, and `grpojob trainer` (main.main). Submodules import torch; this one does not."""
