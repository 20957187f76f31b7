"""grpojob: Kubernetes-native GRPO reinforcement learning for LLMs.

The top-level package imports nothing heavy: the operator image has no torch.
"""
__version__ = "0.1.0"
