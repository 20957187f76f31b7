"""Where a CheckpointManager keeps checkpoints: a directory (layout.py: a temporary directory
renamed into place) or an object store (objects.py: a commit marker). The manager's save, commit
and load are the same for both; what differs is here.

A save's `handle` (a string every rank gets from rank 0) names where it goes: the temporary
directory, or the checkpoint's URL in the store. `files(handle)` is where rank 0 writes its own
files (the state file, hf/, adapter/): in the directory itself, or a local scratch directory
uploaded at the commit (on the writer's thread: the save stays asynchronous)."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any, Optional, Union

import torch

from grpojob.checkpoint import layout, objects, pods, storage
from grpojob.learner import dist
from grpojob.learner.errors import TrainerError


class Directory:
    """`pods`: None while one directory holds every rank's shards (found by `check`), else the
    ranks of each pod's own directory (pods.py: a claim per trainer pod)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.pods: Optional[list[list[int]]] = None

    def check(self, env: dist.DistEnv) -> None:
        """Every rank can write under root; whether root is one directory for all or one per pod (collective)."""
        _all_or_none(env, lambda: storage.probe(self.root, f".probe-{env.rank}-{uuid.uuid4().hex}"), self.root)
        self.pods = pods.groups(self.root, env)

    def leads(self, env: dist.DistEnv) -> bool:
        """This rank makes, commits and drops its directory's part of a save."""
        return env.is_leader if self.pods is None else env.rank == min(pods.pod_of(self.pods, env.rank))

    def savers(self, env: dist.DistEnv) -> int | list[int]:
        """The ranks over which the replicated tensors of a save are spread (checkpoint.pods.own_part)."""
        return env.world if self.pods is None else pods.pod_of(self.pods, env.rank)

    def latest(self) -> Optional[Path]:
        return layout.latest(self.root)

    def new(self, step: int) -> str:
        """The temporary directory's name (under each pod's own root on per-pod claims)."""
        return layout.temp_dir(self.root, step).name

    def prepare(self, handle: str, env: dist.DistEnv) -> None:
        (self.root / handle / layout.SHARDS).mkdir(parents=True)
        if self.pods is not None:
            pods.write_manifest(self.root / handle, env, self.pods)

    def files(self, handle: str) -> Path:
        return self.root / handle

    def writer(self, handle: str, rank: int) -> dict[str, Any]:
        if self.pods is not None:  # each rank its own DCP checkpoint (no collective: see no_dist)
            return {"checkpoint_id": str(layout.rank_dir(self.root / handle, rank))}
        return {"checkpoint_id": str(self.root / handle / layout.SHARDS)}

    def commit(self, handle: str, step: int, keep_last: int) -> Path:
        final = layout.step_dir(self.root, step)
        layout.commit(self.root, self.root / handle, final, keep_last, prune_now=self.pods is None)
        return final

    def prune(self, keep_last: int) -> None:
        """Per-pod claims: once every pod has committed."""
        layout.prune(self.root, keep_last)

    def drop(self, handle: str) -> None:
        shutil.rmtree(self.root / handle, ignore_errors=True)

    def is_legacy(self, path) -> bool:
        return layout.is_legacy(path)

    def reader(self, path) -> dict[str, Any]:
        return {"checkpoint_id": str(Path(path) / layout.SHARDS)}

    def is_per_pod(self, path) -> bool:
        return layout.is_per_pod(path)

    def read_state(self, path) -> dict[str, Any]:
        return torch.load(Path(path) / layout.STATE_FILE, map_location="cpu", weights_only=True)


class ObjectStore:
    def __init__(self, url: str):
        self.store = objects.Store(url)
        self.root = self.store.url
        self._scratch: dict[str, Path] = {}

    def _refused(self, e: Exception, what: str) -> storage.StorageRefused:
        if isinstance(e, OSError) or objects.store_error(e):
            return storage.StorageRefused(f"{storage.FIELD}: the trainer cannot {what} {self.root}: "
                                          f"{storage.store_advice(e)}")
        raise e

    def check(self, env: dist.DistEnv) -> None:
        def probe() -> None:
            try:
                self.store.probe()
            except Exception as e:  # noqa: BLE001 - the store's client errors: no OSError hierarchy
                raise self._refused(e, "write checkpoints to") from e
        _all_or_none(env, probe, self.root)

    def latest(self) -> Optional[str]:
        """The newest committed checkpoint (rank 0, at start: the first request to the store)."""
        try:
            return self.store.latest()
        except Exception as e:  # noqa: BLE001 - the store's client errors: no OSError hierarchy
            raise self._refused(e, "list checkpoints at") from e

    def leads(self, env: dist.DistEnv) -> bool:
        return env.is_leader

    def savers(self, env: dist.DistEnv) -> int:
        return env.world

    def new(self, step: int) -> str:
        return self.store.step_url(step)

    def prepare(self, handle: str, env: dist.DistEnv) -> None:
        self.store.begin(int(objects.STEP.match(self.store.name_of(handle)).group(1)))

    def files(self, handle: str) -> Path:
        if handle not in self._scratch:
            self._scratch[handle] = objects.local_scratch()
        return self._scratch[handle]

    def writer(self, handle: str, rank: int) -> dict[str, Any]:
        from grpojob.checkpoint.store_dcp import StoreWriter

        return {"storage_writer": StoreWriter(self.store.store, f"{self.store.name_of(handle)}/{layout.SHARDS}")}

    def commit(self, handle: str, step: int, keep_last: int) -> str:
        scratch = self._scratch.pop(handle, None)
        try:
            if scratch is not None:
                self.store.put_dir(scratch, handle)
            self.store.commit(handle, keep_last)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return handle

    def drop(self, handle: str) -> None:
        scratch = self._scratch.pop(handle, None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        self.store.drop(handle)

    def is_legacy(self, path) -> bool:
        return False  # the full-state layout predates object-store checkpoints

    def is_per_pod(self, path) -> bool:
        return False

    def reader(self, path) -> dict[str, Any]:
        from grpojob.checkpoint.store_dcp import StoreReader

        return {"storage_reader": StoreReader(self.store.store, f"{self.store.name_of(str(path))}/{layout.SHARDS}")}

    def read_state(self, path) -> dict[str, Any]:
        import io

        data = self.store.read(str(path), layout.STATE_FILE)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


Place = Union[Directory, ObjectStore]


def of(root: Union[str, Path]) -> Place:
    """The place of spec.checkpoint.path (or the directory the pods mount there)."""
    if objects.is_store(str(root)) and not isinstance(root, Path):
        return ObjectStore(str(root))
    return Directory(Path(root))


def _all_or_none(env: dist.DistEnv, probe, root) -> None:
    """`probe` on every rank; StorageRefused on every rank if one failed (its own where it failed)."""
    error: Optional[storage.StorageRefused] = None
    try:
        probe()
    except storage.StorageRefused as e:
        error = e
    if env.initialized and env.world > 1:
        if bool(dist.all_max(torch.tensor([int(error is not None)]), env).item()) and error is None:
            error = storage.StorageRefused(f"{storage.FIELD}: another trainer rank cannot write checkpoints "
                                           f"under {root} (its error says why)")
    if error is not None:
        raise error
