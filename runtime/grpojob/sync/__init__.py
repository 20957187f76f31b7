"""Weight sync from trainer rank 0 to the rollout servers.

Trainer side:
- `WeightPublisher` (`publisher.py`): hosts the rendezvous TCPStore, pushes versions, lists the
  rollout servers (`rollout_addresses()`);
- `membership.py`: registrations (verified, routed), heartbeats, dropping servers;
- `delivery.py`: planning a push by route, packing the buckets, sending, acknowledgements;
- `placement.py`: which path a push takes to each endpoint (nccl, cuda-ipc, shm, gloo, checkpoint).

Rollout side:
- `SyncAgent` (`agent.py`): registers, heartbeats, applies pushes to its engine;
- `receiver.py`: receives one endpoint's push over its route; `vllm_worker.py`: the vLLM worker
  extension that does so inside every worker.

Shared: `protocol.py` (the store keys), `buckets.py` (the bucket layout), `group.py` (collective
transfers), `handoff.py` (same-host transfers: /dev/shm and CUDA IPC), `files.py` (safetensors).
"""
from grpojob.sync.protocol import WeightSyncError

__all__ = ["WeightPublisher", "SyncAgent", "WeightSyncError"]


def __getattr__(name):  # torch-heavy parts load on first use
    if name == "WeightPublisher":
        from grpojob.sync.publisher import WeightPublisher
        return WeightPublisher
    if name == "SyncAgent":
        from grpojob.sync.agent import SyncAgent
        return SyncAgent
    raise AttributeError(name)
