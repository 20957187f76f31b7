"""torch.distributed for the trainer: process group from the torchrun environment, data-parallel
wrapping (FSDP2 `fully_shard` or DDP), and the few collectives the loop needs. With one process
and no torchrun environment everything degrades to local no-ops."""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn

from grpojob import devices

log = logging.getLogger("grpojob.learner.dist")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized: bool = False  # a process group exists

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


# The default group's backends per device. On GPUs it must have a CPU backend too: NCCL carries
# only CUDA tensors, and the loop's own collectives (all_max/all_sum of small CPU tensors,
# broadcast_object_list's sizes under gloo, barrier) and DCP's asynchronous save ("A CPU backend
# must be enabled for async save") need one. torch routes each collective by its tensors' device.
BACKENDS = {"cuda": "cpu:gloo,cuda:nccl", "cpu": "gloo"}


def backend(device: torch.device) -> str:
    return BACKENDS["cuda" if device.type == "cuda" else "cpu"]


def has_cpu_backend(group=None) -> bool:
    """The group (default: the default group) carries CPU tensors."""
    g = group if group is not None else dist.group.WORLD
    return torch.device("cpu") in getattr(g, "_device_types", [torch.device("cpu")])


def lone() -> DistEnv:
    """One process without a process group, on this process's device (grpojob.devices: the pinned
    GRPOJOB_DEVICE, else the GPU when there is one): never the CPU by default on a GPU machine."""
    return DistEnv(device=_device(0))


def init(timeout_seconds: float = 600) -> DistEnv:
    """Join the torchrun process group (`backend(device)`); single process without torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return lone()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        name = backend(device)
        dist.init_process_group(name, timeout=datetime.timedelta(seconds=timeout_seconds))
        log.info("process group up", extra={"backend": name, "rank": rank, "world": world})
    return DistEnv(rank=rank, world=world, local_rank=local_rank, device=device, initialized=True)


def _device(local_rank: int) -> torch.device:
    return devices.default(local_rank)


# How long a rank that finished waits at the end for its peers to finish too (shutdown).
LEAVE_SECONDS = 20.0


def shutdown(env: DistEnv, clean: bool = True, timeout: float = LEAVE_SECONDS) -> bool:
    """Leave the process group; False when the peers did not all arrive within `timeout`.

    clean: every rank finished normally, so they leave together: a barrier, then the group is
    destroyed (destroying a gloo group while a peer still has work in flight aborts the process:
    "terminate called without an active exception"). The barrier waits `timeout` seconds, not the
    group's (up to 30 min): a peer that died or hangs would hold this rank that long. When it times
    out, the group is not destroyed (a gloo worker thread is still in the barrier, and destroying
    joins it): the caller ends the process (lifeline.exit_now). After a failure no barrier: the
    peers may be stuck in another collective."""
    if not (env.initialized and dist.is_initialized()):
        return True
    if clean and env.world > 1:
        try:
            dist.barrier(async_op=True).wait(datetime.timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - a dead or hung peer: nothing left to wait for
            log.warning("leaving the process group without the peers (%s): not every rank arrived in %.0f s",
                        e, timeout)
            return False
    dist.destroy_process_group()
    return True


def strategy(requested: str, env: DistEnv) -> str:
    """none (one rank), fsdp or ddp. auto: FSDP2 on GPU, DDP on CPU (gloo has no reduce-scatter
    fast path and the models trained on CPU are small enough to replicate)."""
    if env.world == 1 or not env.initialized:
        return "none"
    if requested == "auto":
        return "fsdp" if env.device.type == "cuda" else "ddp"
    return requested


def wrap(module: nn.Module, kind: str, env: DistEnv, layers: Optional[list[nn.Module]] = None) -> nn.Module:
    """Data-parallel wrapper. fsdp: each decoder layer and then the root are sharded."""
    if kind == "none":
        return module
    if kind == "ddp":
        ids = [env.device.index] if env.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids, broadcast_buffers=False)
    if kind == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(env.device.type, (env.world,))
        for layer in layers or []:
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module
    raise ValueError(f"training.strategy: unknown '{kind}'")


@contextlib.contextmanager
def no_grad_sync(module: nn.Module, skip: bool) -> Iterator[None]:
    """Accumulate gradients locally (no all-reduce / reduce-scatter) while `skip`."""
    if not skip:
        yield
        return
    if isinstance(module, nn.parallel.DistributedDataParallel):
        with module.no_sync():
            yield
        return
    setter = getattr(module, "set_requires_gradient_sync", None)  # FSDP2
    if setter is not None:
        setter(False)
        try:
            yield
        finally:
            setter(True)
        return
    yield


def unwrap(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def all_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.initialized and env.world > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_max(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.initialized and env.world > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def barrier(env: DistEnv) -> None:
    if env.initialized and env.world > 1:
        dist.barrier()


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's object on every rank."""
    if not (env.initialized and env.world > 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def scatter_objects(objs: Optional[list[Any]], env: DistEnv) -> Any:
    """Rank 0's objs[r] on each rank r (objs is read on rank 0 only)."""
    if not (env.initialized and env.world > 1):
        assert objs is not None
        return objs[0]
    box: list[Any] = [None]
    dist.scatter_object_list(box, objs if env.is_leader else None, src=0)
    return box[0]


def gather_objects(obj: Any, env: DistEnv) -> Optional[list[Any]]:
    """Every rank's object on rank 0 (None elsewhere)."""
    if not (env.initialized and env.world > 1):
        return [obj]
    out = [None] * env.world if env.is_leader else None
    dist.gather_object(obj, out, dst=0)
    return out


def all_gather_objects(obj: Any, env: DistEnv, group=None) -> list[Any]:
    """Every rank's object on every rank (`group`: default the default group)."""
    if not (env.initialized and env.world > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _options(trainable_only: bool):
    """trainable_only (LoRA): the adapter and its optimizer state, not the frozen base (which the
    model directory holds); loading then leaves the base as it is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False) if trainable_only else None


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, trainable_only: bool = False) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state ({"model", "optimizer"}), keyed by
    parameter names (the same for any world size and wrapper: DDP's `module.` is dropped), for
    torch.distributed.checkpoint. An optimizer without state gets it first (zero step), so the
    dict is also the skeleton a checkpoint loads into. Collective."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=_options(trainable_only))
    return {"model": msd, "optimizer": osd}


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                       trainable_only: bool = False) -> None:
    """Load a `sharded_state` dict (filled in place by torch.distributed.checkpoint.load). Collective."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=_options(trainable_only))


def load_full_state(model: nn.Module, optimizer: Optional[torch.optim.Optimizer], env: DistEnv,
                    msd: Optional[dict], osd: Optional[dict]) -> None:
    """Load a full state (needed on rank 0 only; broadcast from there) into the wrapped model and
    optimizer: checkpoints of the full-state layout. Collective."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    multi = env.initialized and env.world > 1
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=multi)
    set_model_state_dict(model, (msd or {}) if (env.is_leader or not multi) else {}, options=opts)
    if optimizer is not None and (osd is not None or multi):
        set_optimizer_state_dict(model, optimizer, (osd or {}) if env.is_leader else {}, options=opts)
