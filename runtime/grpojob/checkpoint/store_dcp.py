"""torch.distributed.checkpoint's storage on an object store (obstore): every rank puts its own
shards straight into the store, one object per rank, and reads back the byte ranges it needs.

DCP's public StorageWriter and StorageReader, on obstore's native API (a multipart upload per
rank, ranged GETs in parallel). The objects are named as FileSystemWriter names its files
(`__<rank>_0.distcp`: each item torch.save'd one after the other; `.metadata` from the
coordinator, whose storage data are this module's Piece). Items are serialized one at a time:
host memory holds the staged state and one item."""
from __future__ import annotations

import io
import pickle
import uuid
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch.futures import Future
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import WriteResult

METADATA = ".metadata"
SUFFIX = ".distcp"


@dataclass(frozen=True)
class Piece:
    """Where one item lies: the object (relative to the checkpoint's state/) and its byte range."""
    relative_path: str
    offset: int
    length: int


def _done(value: Any) -> Future:
    """DCP waits on torch's futures; the work is done already (the writer runs on DCP's thread)."""
    f: Future = Future()
    f.set_result(value)
    return f


def _narrow(tensor: torch.Tensor, offsets, lengths) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


class StoreWriter(StorageWriter):
    """`store`: an obstore store; `prefix`: the checkpoint's state/ key prefix in it."""

    def __init__(self, store: Any, prefix: str):
        super().__init__()
        self.store, self.prefix = store, prefix.rstrip("/")
        self.save_id = uuid.uuid4().hex

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id:
            self.prefix = str(checkpoint_id).rstrip("/")
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [replace(p, storage_data=f"__{i}_") for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        import obstore

        name = f"{plan.storage_data}0{SUFFIX}"
        results, offset = [], 0
        writer = obstore.open_writer(self.store, self._key(name))
        try:
            # bytes (small: the non-tensor values) first, as FileSystemWriter orders them
            for item in sorted(plan.items, key=lambda i: i.type != WriteItemType.BYTE_IO):
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    blob = data.getbuffer()
                else:
                    buf = io.BytesIO()
                    torch.save(data.detach().cpu().contiguous(), buf)
                    blob = buf.getbuffer()
                writer.write(blob)
                results.append(WriteResult(index=item.index, size_in_bytes=len(blob),
                                           storage_data=Piece(name, offset, len(blob))))
                offset += len(blob)
        except BaseException:
            writer.close()  # a part written is removed below, with the save
            raise
        writer.close()
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        import obstore

        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        obstore.put(self.store, self._key(METADATA), pickle.dumps(metadata))

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.prefix, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


class StoreReader(StorageReader):
    def __init__(self, store: Any, prefix: str):
        super().__init__()
        self.store, self.prefix = store, prefix.rstrip("/")
        self.storage_data: dict[MetadataIndex, Piece] = {}

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def reset(self, checkpoint_id=None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.prefix = str(checkpoint_id).rstrip("/")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        import obstore

        metadata = pickle.loads(bytes(obstore.get(self.store, self._key(METADATA)).bytes()))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = uuid.uuid4().hex
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        import obstore

        by_object: dict[str, list] = {}
        for item in plan.items:
            by_object.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in by_object.items():
            pieces = [self.storage_data[i.storage_index] for i in items]
            blobs = obstore.get_ranges(self.store, self._key(name), starts=[p.offset for p in pieces],
                                       ends=[p.offset + p.length for p in pieces])
            for item, blob in zip(items, blobs):
                stream = io.BytesIO(bytes(blob))
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, stream)
                    continue
                tensor = _narrow(torch.load(stream, map_location="cpu", weights_only=True),
                                 item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != tensor.size():
                    raise ValueError(f"{item.storage_index}: stored {tensor.size()}, expected {target.size()}")
                target.copy_(tensor)
                planner.commit_tensor(item, target)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True
