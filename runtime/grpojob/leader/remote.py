"""Rank 0's link to the rollout servers: the weight-sync store they register with (which is also
how the trainer finds them) and the pushes to them."""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable

import torch

from grpojob.api.spec import WeightSyncSpec
from grpojob.plan import ENV_SYNC_ADDR
from grpojob.leader.rollouts import PushReport
from grpojob.sync.publisher import WeightPublisher

log = logging.getLogger("grpojob.leader.remote")


def sync_address() -> tuple[str, int]:
    value = os.environ.get(ENV_SYNC_ADDR, "")
    host, _, port = value.rpartition(":")
    if not host or not port.isdecimal():
        raise ValueError(f"{ENV_SYNC_ADDR}='{value}' is not host:port")
    return host, int(port)


class RemotePublisher:
    """The WeightPublisher of a trainer with rollout servers (grpojob.sync)."""

    def __init__(self, weight_sync: WeightSyncSpec, host: str, port: int, *, colocated: bool, resumed: bool,
                 device: torch.device, checkpoint_dir: str, token: str):
        self.sync = WeightPublisher(weight_sync, host=host, port=port, device=device, token=token,
                                    initial_version=None if resumed else 0, checkpoint_dir=checkpoint_dir,
                                    colocated=colocated)
        self.rollout_addresses = self.sync.rollout_addresses
        self.draining_addresses = self.sync.draining_addresses

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> PushReport:
        stats = self.sync.push(named_tensors, version)
        log.info("weights pushed", extra={"version": version, "seconds": round(stats["seconds"], 3),
                                          "servers": stats["servers"], "backend": stats["backend"],
                                          "bytes": stats["bytes"], "tensors": stats["tensors"],
                                          "adapter": stats["adapter"]})
        return PushReport(version=version, seconds=stats["seconds"], backend=self.sync.backend_in_use(),
                          servers=stats["servers"], paused_seconds=stats.get("paused_seconds"),
                          dropped=tuple(stats.get("dropped", ())), bytes=stats["bytes"], tensors=stats["tensors"],
                          adapter=stats["adapter"])

    def server_urls(self) -> list[str]:
        """Every registered server's base URL (whatever version it holds)."""
        return [s["url"] for s in self.sync.servers()]

    def servers(self) -> list[dict[str, Any]]:
        return [{"replica": s["replica"], "version": s["version"]} for s in self.sync.servers()]

    def close(self) -> None:
        self.sync.close()
