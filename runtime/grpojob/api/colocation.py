"""spec.placement: where the rollout engine runs relative to the trainer, and what colocated rules out.

separate (default): rollout servers in pods of their own (a Deployment), weights pushed over the
network (or CUDA IPC / shared memory where `grpojob run` puts both on one host).
colocated: one engine next to the trainer, sharing its device(s): a second container of the trainer
pod on a cluster (sharing the pod's /dev/shm, an emptyDir in memory; with GPUs, a second process of
the trainer's container: grpojob.colocated_pod), a second process of the same `grpojob run` locally.
Generation and training take turns on the device (the engine sleeps while the trainer trains), and
weights reach the engine with no network copy: shared memory on the CPU, CUDA IPC on a GPU
(docs/colocated.md).
"""
from __future__ import annotations

from typing import Any, Literal, Protocol

from grpojob.api.ports import RENDEZVOUS_PORT, SYNC_STORE_PORT

SEPARATE, COLOCATED = "separate", "colocated"
Placement = Literal["separate", "colocated"]
DESCRIPTION = (
    "separate: rollout servers run in pods of their own (rollout.replicas), weights are pushed to them. "
    "colocated: one engine runs next to the trainer and shares its device(s) (a second container or "
    "process of the single trainer pod; a second process locally); generation and training take turns, "
    "weights pass with no network copy. Needs trainer.replicas 1 and rollout.replicas 1 (docs/colocated.md).")
# Paths that hand buffers over inside one host: what a colocated push may take.
COLOCATED_SYNC = ("auto", "shm", "cuda-ipc")
# The API server refuses the plainest contradictions at `kubectl apply` (the model validator, which
# the operator and the CLI run, names every one with its field path).
_COLOCATED = "has(self.placement) && self.placement == 'colocated'"
CEL = [
    {"rule": f"!({_COLOCATED}) || ((!has(self.trainer) || !has(self.trainer.replicas) || self.trainer.replicas == 1) "
             "&& (!has(self.rollout) || !has(self.rollout.replicas) || self.rollout.replicas == 1))",
     "message": "placement colocated needs trainer.replicas 1 and rollout.replicas 1"},
    {"rule": f"!({_COLOCATED}) || !has(self.weightSync) || !has(self.weightSync.backend) || "
             f"self.weightSync.backend in {list(COLOCATED_SYNC)!r}",
     "message": "placement colocated needs weightSync.backend auto, shm or cuda-ipc"},
]


def gpus(resources: dict) -> list[str]:
    """The GPU resource names (vendor.com/gpu) a container's resources ask for."""
    return sorted({name for part in ("requests", "limits") for name in (resources.get(part) or {})
                   if name.endswith("/gpu")})


class Parts(Protocol):
    """What the colocated rule reads of a GRPOJobSpec (whose validator calls it: naming that class
    here would make spec.py and this module import each other)."""
    placement: str
    mode: str
    trainer: Any
    rollout: Any
    weight_sync: Any
    environments: list


def problems(spec: Parts) -> list[tuple[str, str]]:
    """(field path relative to spec, why) of every setting colocated cannot work with; [] when
    placement is separate."""
    if spec.placement != COLOCATED:
        return []
    out = []
    if spec.trainer.replicas != 1:
        out.append(("trainer.replicas", f"{spec.trainer.replicas}: placement colocated runs on one node (one "
                    "trainer pod; its ranks share the engine's device): set 1, or use placement separate"))
    if spec.rollout.replicas != 1:
        out.append(("rollout.replicas", f"{spec.rollout.replicas}: placement colocated runs one engine, in the "
                    "trainer pod: set 1 (or leave it out)"))
    if spec.weight_sync.backend not in COLOCATED_SYNC:
        out.append(("weightSync.backend", f"{spec.weight_sync.backend}: placement colocated hands the weights "
                    "to the engine in memory, with no network copy: use auto (shm on CPU, cuda-ipc on GPU), shm "
                    "or cuda-ipc"))
    if spec.environments:
        out.append(("environments", "placement colocated puts the engine to sleep while the trainer trains, "
                    "and environments generate at any time: use placement separate"))
    if spec.mode == "service":
        out.append(("mode", "service: the user's loop decides when to sample and train, and placement "
                    "colocated needs the trainer's loop to take turns with the engine: use placement separate"))
    taken = {spec.trainer.port: "trainer.port", RENDEZVOUS_PORT: "the rendezvous port",
             SYNC_STORE_PORT: "the weight-sync store port"}
    if spec.rollout.port in taken:
        out.append(("rollout.port", f"{spec.rollout.port} is also {taken[spec.rollout.port]}; placement "
                    "colocated runs both in one pod (one network namespace): pick another port"))
    devices = gpus(spec.rollout.resources)
    if devices:
        out.append(("rollout.resources", f"asks for {', '.join(devices)}: a colocated engine shares the trainer "
                    "pod's devices (spec.trainer.resources); devices asked for here would be other ones"))
    if spec.rollout.tensor_parallel_size > spec.trainer.processes_per_replica:
        out.append(("rollout.tensorParallelSize", f"{spec.rollout.tensor_parallel_size} exceeds "
                    f"trainer.processesPerReplica ({spec.trainer.processes_per_replica}): a colocated engine "
                    "shares the trainer pod's devices, one per rank"))
    return out


