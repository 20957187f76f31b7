"""Weights as safetensors files: the checkpoint backend's transport, and loading a model directory.

With `weightSync.backend: checkpoint` the publisher writes each pushed version under
`<checkpoint dir>/rollout-weights/v<version>/` (written to a temporary name, then renamed, so a
reader never sees half a version) and the rollout servers, which mount the same volume, load it.
A LoRA version is a PEFT adapter directory (grpojob.sync.adapter), which the engines apply to
the base weights they keep.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Iterator, Optional

import torch

from .stream import TensorStream

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
        from . import adapter  # it writes with write_safetensors below

        adapter.save(tmp, stream)
    else:
        write_safetensors(tmp / "model.safetensors", stream)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    versions = sorted(p for p in final.parent.iterdir() if p.is_dir() and not p.name.endswith(".tmp"))
    for old in versions[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return rel


# safetensors' dtype names (https://huggingface.co/docs/safetensors/index#format)
_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


def write_safetensors(path: str | os.PathLike, stream: TensorStream, metadata: Optional[dict[str, str]] = None) -> int:
    """One safetensors file written tensor by tensor: the header (names, dtypes, shapes, offsets)
    comes from the stream's specs, then each tensor's bytes as it is produced, so no more than one
    tensor is held here (the safetensors library only writes whole dicts). Returns the bytes of
    tensor data."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    at = 0
    for name, shape, dtype in stream.specs:
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name, shape, dtype in stream.specs:
            t = stream.take(name).detach()
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"{name}: produced {tuple(t.shape)} {t.dtype}, announced {shape} {dtype}")
            f.write(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
            del t
    return at


def iter_dir(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the *.safetensors files in a directory (a model dir or a pushed version)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
