"""One trainer rank's learner: the policy, its forward and backward (packing, attention,
log-probs), the optimizer and schedule, LoRA, and the process group. Runs in every trainer rank;
knows nothing of rollouts, the loop or HTTP. Submodules import torch; this one does not."""
