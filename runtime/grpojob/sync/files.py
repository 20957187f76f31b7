"""The checkpoint backend's transport: weights as safetensors files on a shared volume.

With `weightSync.backend: checkpoint` the publisher writes each pushed version under
`<checkpoint dir>/rollout-weights/v<version>/` (written to a temporary name, then renamed, so a
reader never sees half a version) and the rollout servers, which mount the same volume, load it.
A LoRA version is a PEFT adapter directory (grpojob.sync.adapter), which the engines apply to
the base weights they keep.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from grpojob.sync import adapter
from grpojob.sync.stream import TensorStream
from grpojob.sync.tensorfiles import write_safetensors

SUBDIR = "rollout-weights"
KEEP = 3  # versions kept: a slow server may still be reading the previous one


def save(root: str | os.PathLike, version: int, stream: TensorStream) -> str:
    """Write one version (tensor by tensor from the stream); returns its path relative to `root`."""
    rel = f"{SUBDIR}/v{version:09d}"
    final = Path(root) / rel
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if stream.adapter is not None:
        adapter.save(tmp, stream)
    else:
        write_safetensors(tmp / "model.safetensors", stream)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    versions = sorted(p for p in final.parent.iterdir() if p.is_dir() and not p.name.endswith(".tmp"))
    for old in versions[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return rel
