"""Checkpoints on a claim per trainer pod: ReadWriteOnce storage, where no two pods see one
directory (the StatefulSet's volumeClaimTemplate gives every pod its own claim).

- Found at start, not configured (`groups`): every rank writes a probe file and looks for every
  other rank's. Ranks that see each other's share a directory; all of them: the shared layout (one
  DCP checkpoint that resumes on any world size). Otherwise the directories must split the ranks
  into groups (pods) that each see only their own.
- A save: every rank writes its own DCP checkpoint (its shards and .metadata, no collective) into
  state/rank-NNNNN/ of its pod's temporary directory. The replicated tensors (DDP's parameters,
  FSDP2's step counters) are spread over the pod's ranks (`own_part`), so each pod holds a whole
  copy of them and never needs another pod's files to resume. The pod's leader (its lowest rank)
  writes pod.json (the world size, every pod's ranks); rank 0 the state file and hf/.
- The commit: once every rank of every pod has written (`agree`, over the manager's gloo group),
  each pod's leader renames its directory into place and moves its `latest`; only once every pod
  has committed does any pod prune (keepLast). A pod killed between the others' renames leaves the
  previous checkpoint whole on every claim.
- A resume takes the newest step that every rank finds whole in its own directory (`common`). A
  claim that lost the checkpoints the others hold, or a changed world size, stops the trainer with
  the reason and the fix (StorageRefused: the same at every start, not restarted).
"""
from __future__ import annotations

import errno
import json
import uuid
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.tensor import DTensor

from grpojob.checkpoint import layout, storage
from grpojob.learner import dist
from grpojob.learner.errors import TrainerError

FORMAT = 1
SAME_WORLD = ("per-pod checkpoints resume on the world size that saved them (each pod's claim holds only "
              "its own ranks' shards); to change trainer.replicas or processesPerReplica, give the trainer "
              "storage every pod shares (a ReadWriteMany spec.checkpoint.volumeClaim, or spec.checkpoint.path "
              "s3://...), whose checkpoints reshard to any world size, or start afresh (spec.checkpoint.resume "
              "false)")


def groups(root: Path, env: dist.DistEnv) -> Optional[list[list[int]]]:
    """None: every rank sees one directory at `root`; else the ranks of each directory (collective)."""
    if not (env.initialized and env.world > 1):
        return None
    mine = root / f".probe-{env.rank}-{uuid.uuid4().hex}"
    mine.touch()
    try:
        names = dist.all_gather_objects(mine.name, env)
        seen = dist.all_gather_objects([(root / n).exists() for n in names], env)
    finally:  # every rank looked before any left the second gather
        mine.unlink(missing_ok=True)
    if all(all(row) for row in seen):
        return None
    sets = [frozenset(j for j, s in enumerate(row) if s) for row in seen]
    for i, s in enumerate(sets):
        if i not in s or any(sets[j] != s for j in s):
            raise storage.StorageRefused(
                f"{storage.FIELD}: {root} is neither one directory for every trainer rank nor one per trainer pod "
                f"(rank {i} sees the probe files of ranks {sorted(s)}, each of those must see the same): mount one "
                f"volume per pod (the default claim per pod), one ReadWriteMany claim for all "
                f"(spec.checkpoint.volumeClaim), or use an object store")
    return sorted(sorted(s) for s in set(sets))


def pod_of(pods: list[list[int]], rank: int) -> list[int]:
    return next(p for p in pods if rank in p)


def own_part(state: dict[str, Any], rank: int, world: int | list[int]) -> dict[str, Any]:
    """The part of a sharded state dict this rank saves: its DTensor shards and non-tensor values,
    and the replicated (plain) tensors assigned to it among `world` (a count: ranks 0..world-1; a
    list: the ranks of its pod), largest first to the least-loaded rank (the same assignment on
    every rank: their replicated tensors are the same). Rank 0 gets none while it has a peer: it
    also runs the rollout manager, the weight publisher and the leader endpoint, and an
    asynchronous save stages a copy of what it writes."""
    ranks = list(range(world)) if isinstance(world, int) else sorted(world)
    if len(ranks) == 1:
        return state
    savers = [r for r in ranks if r != 0]
    sizes: list[tuple[tuple[str, ...], int]] = []

    def walk(d: dict, path: tuple[str, ...]) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, path + (str(k),))
            elif isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
                sizes.append((path + (str(k),), v.numel() * v.element_size()))
    walk(state, ())
    load, owner = [0] * len(savers), {}
    for path, n in sorted(sizes, key=lambda x: (-x[1], x[0])):
        i = load.index(min(load))
        owner[path] = savers[i]
        load[i] += n

    def keep(d: dict, path: tuple[str, ...]) -> dict:
        out = {}
        for k, v in d.items():
            p = path + (str(k),)
            if isinstance(v, dict):
                out[k] = keep(v, p)
            elif owner.get(p, rank) == rank:
                out[k] = v
        return out
    return keep(state, ())


def _replicated(d: dict) -> dict:
    """Only the plain tensors of a part (what a peer on the same pod saved for every rank of it)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            sub = _replicated(v)
            if sub:
                out[k] = sub
        elif isinstance(v, torch.Tensor) and not isinstance(v, DTensor):
            out[k] = v
    return out


def _merge(into: dict, part: dict) -> None:
    """DCP loads tensors in place but puts other values into the dict it is given: back into `into`."""
    for k, v in part.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def manifest(env: dist.DistEnv, pods: list[list[int]]) -> dict[str, Any]:
    return {"format": FORMAT, "world": env.world, "ranks": pod_of(pods, env.rank), "pods": pods}


def write_manifest(handle: Path, env: dist.DistEnv, pods: list[list[int]]) -> None:
    (handle / layout.POD_FILE).write_text(json.dumps(manifest(env, pods)) + "\n")


def agree(error: Optional[BaseException], mine: Optional[tuple[bool, Optional[int], str]], env: dist.DistEnv,
          group) -> Optional[BaseException]:
    """Every rank's outcome of a step of the save (collective over `group`; `mine`: None, or whether
    `error` is the storage's, its errno, and what it says); each rank gets the same kind: None, its
    own error, or a stand-in naming the rank that failed (a storage error, with its errno, where
    that one was: the whole save is dropped and training goes on alike on every rank)."""
    everyone = dist.all_gather_objects(mine, env, group)
    failed = [(r, x) for r, x in enumerate(everyone) if x is not None]
    if not failed:
        return None
    other = next(((r, x) for r, x in failed if not x[0]), None)
    if other is not None and (mine is None or mine[0]):  # any rank's failure other than storage: not dropped
        return TrainerError(f"trainer rank {other[0]}'s checkpoint failed: {other[1][2]}")
    if error is not None:
        return error
    r, (_, code, text) = failed[0]
    return OSError(code or errno.EIO, f"trainer rank {r} could not write its part: {text}")


def common(root: Path, env: dist.DistEnv) -> Optional[Path]:
    """The newest checkpoint every rank finds whole under its own `root` (collective); StorageRefused
    where some ranks hold checkpoints and others none of them (a claim lost or replaced)."""
    mine = [step for step, _ in layout.list_checkpoints(root)]
    everyone = dist.all_gather_objects(mine, env)
    shared = set(everyone[0]).intersection(*map(set, everyone[1:]))
    if shared:
        return layout.step_dir(root, max(shared))
    holding = [r for r, steps in enumerate(everyone) if steps]
    if not holding:
        return None
    empty = [r for r, steps in enumerate(everyone) if not steps]
    raise storage.StorageRefused(
        f"{storage.FIELD}: trainer ranks {holding} hold checkpoints (steps {sorted(set().union(*everyone))}) but "
        + (f"ranks {empty} none" if empty else "no step is whole on every rank")
        + f" under {root}: on a claim per pod each pod's claim holds its own ranks' shards, and a resume needs "
        "every pod's. A claim that was deleted or replaced lost them (keep the job's claims: they are deleted with "
        "the job), or the world size changed: " + SAME_WORLD)


def check(path: Path, env: dist.DistEnv) -> list[int]:
    """The ranks whose parts this rank's pod holds in checkpoint `path`, after checking this run
    matches the one that saved it (collective: every rank refuses alike)."""
    why, ranks = None, []
    try:
        saved = json.loads((Path(path) / layout.POD_FILE).read_text())
        ranks = list(saved["ranks"])
        if saved["world"] != env.world or env.rank not in ranks:
            why = (f"spec.trainer: the checkpoint {path} was saved by {saved['world']} trainer ranks on a claim per "
                   f"pod (pods: {saved['pods']}); this run has {env.world} and rank {env.rank} finds the part of "
                   f"ranks {ranks} on its claim: {SAME_WORLD}")
    except (OSError, ValueError, KeyError) as e:
        why = f"{storage.FIELD}: cannot read {Path(path) / layout.POD_FILE}: {e}"
    refused = dist.all_max(torch.tensor([int(why is not None)]), env)
    if why is None and int(refused.item()):
        why = f"{storage.FIELD}: another trainer rank cannot resume from {path} (its error says why)"
    if why is not None:
        raise storage.StorageRefused(why)
    return ranks


def load(shards: dict[str, Any], path: Path, env: dist.DistEnv, pg) -> None:
    """Fill a rank's skeleton from its pod's part of checkpoint `path`: its own DCP checkpoint
    (its shards, the non-tensor values, its replicated tensors), then the replicated tensors its
    pod's peers saved."""
    from torch.distributed import checkpoint as dcp

    ranks = check(path, env)
    for r in ranks:
        part = own_part(shards, r, ranks)
        if r != env.rank:
            part = _replicated(part)
        if not part:
            continue
        dcp.load(part, process_group=pg, no_dist=True, checkpoint_id=str(layout.rank_dir(path, r)))
        _merge(shards, part)
