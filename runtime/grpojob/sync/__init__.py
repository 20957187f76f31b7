"""Weight sync from trainer rank 0 to the rollout servers.

- `WeightPublisher` (trainer rank 0, `publisher.py`): hosts the rendezvous TCPStore, pushes
  versions in flat dtype-grouped buckets over a standalone gloo/NCCL group (or files, for
  backend checkpoint), lists the rollout servers (`rollout_addresses()`).
- `SyncAgent` (rollout server, `agent.py`): registers, heartbeats, applies pushes to its engine.
- `vllm_worker.WeightSyncExtension`: the vLLM worker extension that receives into the workers.
- `protocol.py` documents the store keys both sides use; `buckets.py` the bucket layout.
"""
from .protocol import WeightSyncError

__all__ = ["WeightPublisher", "SyncAgent", "WeightSyncError"]


def __getattr__(name):  # torch-heavy parts load on first use
    if name == "WeightPublisher":
        from .publisher import WeightPublisher
        return WeightPublisher
    if name == "SyncAgent":
        from .agent import SyncAgent
        return SyncAgent
    raise AttributeError(name)
