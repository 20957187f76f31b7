"""The trainer's remote parts: groups from the rollout servers, weights to them.

Rank 0 hosts the weight-sync store (rollout servers register there, which is also how the
trainer finds them), drives a RolloutManager over the whole global batch and pushes weights;
the other ranks send their share of prompts to rank 0 and get their groups back, so generation
load is spread over the servers and not over the trainer ranks.
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as tdist

from ..plan import ENV_SYNC_ADDR
from ..rollout.types import Group, Sample

log = logging.getLogger("grpojob.trainer.remote")


def sync_address() -> tuple[str, int]:
    value = os.environ.get(ENV_SYNC_ADDR, "")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{ENV_SYNC_ADDR}='{value}' is not host:port")
    return host, int(port)


class RemoteRollouts:
    """The GroupSource of every rank; rank 0's also pushes weights (through `Publisher`)."""

    def __init__(self, job, trainer, listen_host: str):
        from ..rollout import workflows
        from ..rollout.client import RolloutClient
        from ..rollout.manager import RolloutManager
        from ..sync import WeightPublisher

        self.env = trainer.env
        spec = job.spec
        # A resumed policy differs from the weights on disk: no version is current until the
        # trainer's first publish (the loop publishes once after a resume, before its first step).
        resumed = trainer.version > 0
        self.publisher = self.manager = None
        if self.env.is_leader:
            _, port = sync_address()
            self.publisher = WeightPublisher(spec, listen_host, port, initial_version=None if resumed else 0)
            if trainer.board is not None:  # grpojob_rollout_servers and _server_lag, read at each scrape
                trainer.board.watch_rollouts(self.publisher.servers)
            client = RolloutClient(self.publisher.rollout_addresses,
                                   timeout=float(spec.weight_sync.timeout_seconds) * 3)
            self.manager = RolloutManager(client, workflows.build(spec, trainer.tokenizer),
                                          max_staleness=spec.algorithm.max_staleness,
                                          policy_version=trainer.version)

    def next_groups(self, samples: Sequence[Sample], policy_version: int) -> list[Group]:
        if self.env.world == 1:
            assert self.manager is not None
            return self.manager.next_groups(list(samples), policy_version)
        shares: Optional[list] = [None] * self.env.world if self.env.is_leader else None
        tdist.gather_object(list(samples), shares, dst=0)
        out: Optional[list] = None
        if self.env.is_leader:
            assert self.manager is not None and shares is not None
            groups = self.manager.next_groups([s for share in shares for s in share], policy_version)
            out, at = [], 0
            for share in shares:
                out.append(groups[at:at + len(share)])
                at += len(share)
        mine: list = [None]
        tdist.scatter_object_list(mine, out, src=0)
        return mine[0]

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        assert self.publisher is not None and self.manager is not None
        stats = self.publisher.push(named_tensors, version)
        self.manager.set_policy_version(version)
        log.info("weights pushed", extra={"version": version, "seconds": round(stats.get("seconds", 0), 3),
                                          "servers": stats.get("servers")})

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()
        if self.publisher is not None:
            self.publisher.close()


class Publisher:
    """Rank 0's WeightPublisher (a separate object: a source with `publish` would be taken for a
    publisher on every rank)."""

    def __init__(self, remote: RemoteRollouts):
        self.remote = remote

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.remote.push_weights(named_tensors, version)


def make_remote(job, trainer, listen_host: str):
    """(GroupSource, WeightPublisher or None) for this rank."""
    remote = RemoteRollouts(job, trainer, listen_host)
    return remote, (Publisher(remote) if trainer.env.is_leader else None)
