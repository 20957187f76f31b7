"""safetensors files: a TensorStream written tensor by tensor, and the tensors of a directory read
back (a model directory, a pushed version, a checkpoint's export)."""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Iterator, Optional

import torch

from grpojob.sync.stream import TensorStream

# A delta version of the checkpoint backend (grpojob.sync.files): what changed since a base version,
# which only an engine holding that base can apply; `iter_dir` refuses it.
DELTA_FILE = "delta.safetensors"


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

    if (Path(path) / DELTA_FILE).exists():
        raise ValueError(f"{path} is a delta version (changes against a version the engine holds), not a whole "
                         f"model: only an engine that declares delta_files loads it (grpojob.sync.files.read_delta)")
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
