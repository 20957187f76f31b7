"""The checkpoint backend's transport: weights as safetensors files on a shared volume.

With `weightSync.backend: checkpoint` the publisher writes each pushed version under
`<checkpoint dir>/rollout-weights/v<version>/` (written to a temporary name, then renamed, so a
reader never sees half a version) and the rollout servers, which mount the same volume, load it.
A LoRA version is a PEFT adapter directory (grpojob.sync.adapter), which the engines apply to
the base weights they keep.

With weightSync.delta, a server whose engine declares `delta_files` and holds the previous
version gets `v<version>-delta/` instead: one safetensors file (`tensorfiles.DELTA_FILE`) with the
flat positions and new values of what changed in each tensor (concatenated; the metadata lists
each tensor's count), and under its own name each tensor that changed too much to send as
positions; tensors that did not change are absent. Its metadata names the base (the weights id
it applies to): an engine applies it only onto that base (`read_delta`). Everyone else, and a server that joins later, gets
the version whole.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from grpojob.sync import adapter
from grpojob.sync.stream import TensorStream
from grpojob.sync.tensorfiles import DELTA_FILE, write_safetensors

SUBDIR = "rollout-weights"
KEEP = 3  # versions kept: a slow server may still be reading the previous one
BASE_KEY = "grpojob.delta.base"  # the delta file's metadata: the weights id it applies to
CHANGES_KEY = "grpojob.delta.changes"  # and [name, dtype, count] of each changed tensor, in order
PREFIX = "grpojob.delta."  # the names of the changes' tensors (no model names a tensor so)
POSITIONS, VALUES = PREFIX + "positions", PREFIX + "values."
_VERSION_DIR = re.compile(r"v(\d+)(-delta)?$")


@dataclass
class Delta:
    """A delta version as read back: `changes` per tensor that changed, as `delta.by_tensor` gives
    them ((flat positions as int64, new values), or None for a tensor in `whole`)."""
    base: str
    changes: dict[str, Optional[tuple[torch.Tensor, torch.Tensor]]]
    whole: dict[str, torch.Tensor]


def save(root: str | os.PathLike, version: int, stream: TensorStream) -> str:
    """Write one version (tensor by tensor from the stream); returns its path relative to `root`."""
    def write(tmp: Path) -> None:
        if stream.adapter is not None:
            adapter.save(tmp, stream)
        else:
            write_safetensors(tmp / "model.safetensors", stream)
    return _commit(root, f"{SUBDIR}/v{version:09d}", write)


def save_delta(root: str | os.PathLike, version: int, base: str,
               changes: dict[str, Optional[tuple[torch.Tensor, torch.Tensor]]],
               whole: Callable[[str], torch.Tensor]) -> tuple[str, int]:
    """Write a delta version against `base` (`changes` as `delta.by_tensor` gives them; `whole(name)`:
    the new tensor of one that goes whole); returns its path relative to `root` and its bytes of
    tensor data. The positions of every changed tensor go into one tensor and its values into one
    per dtype, in the order the metadata lists them: hundreds of small tensors cost a reader and
    a writer 20 us each."""
    named, listed = [], []
    pos: list[torch.Tensor] = []
    val: dict[str, list[torch.Tensor]] = {}
    for name, change in changes.items():
        if change is None:
            named.append((name, whole(name)))
        elif len(change[0]):
            dtype = str(change[1].dtype).removeprefix("torch.")
            listed.append([name, dtype, len(change[0])])
            pos.append(change[0])
            val.setdefault(dtype, []).append(change[1])
    if pos:
        flat = torch.cat(pos)
        small = int(flat.max()) < 2**31
        named.append((POSITIONS, flat.to(torch.int32 if small else torch.int64)))
        named += [(VALUES + dtype, torch.cat(vs)) for dtype, vs in val.items()]
    meta = {BASE_KEY: base, CHANGES_KEY: json.dumps(listed)}
    written = []
    rel = _commit(root, f"{SUBDIR}/v{version:09d}-delta", lambda tmp: written.append(
        write_safetensors(tmp / DELTA_FILE, TensorStream.of(named), meta)))
    return rel, written[0]


def is_delta(path: str | os.PathLike) -> bool:
    return (Path(path) / DELTA_FILE).exists()


def read_delta(path: str | os.PathLike) -> Delta:
    """A delta version's base and changes (ValueError for a file that is not one)."""
    from safetensors import safe_open

    f = Path(path) / DELTA_FILE
    with safe_open(str(f), framework="pt") as st:
        meta = st.metadata() or {}
        if not meta.get(BASE_KEY) or CHANGES_KEY not in meta:
            raise ValueError(f"{f}: no {BASE_KEY} in its metadata: not a delta version of grpojob's")
        listed = json.loads(meta[CHANGES_KEY])
        names = set(st.keys())
        whole = {n: st.get_tensor(n) for n in names if not n.startswith(PREFIX)}
        changes: dict = dict.fromkeys(whole)
        if listed:
            pos = st.get_tensor(POSITIONS).to(torch.int64).split([n for _, _, n in listed])
            vals = {d: iter(st.get_tensor(VALUES + d).split([n for _, dt, n in listed if dt == d]))
                    for d in {dt for _, dt, _ in listed}}
            for (name, dtype, _), p in zip(listed, pos):
                changes[name] = (p, next(vals[dtype]))
    return Delta(meta[BASE_KEY], changes, whole)


def _commit(root: str | os.PathLike, rel: str, write: Callable[[Path], None]) -> str:
    final = Path(root) / rel
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _prune(final.parent)
    return rel


def _prune(parent: Path) -> None:
    """Keep the directories of the newest KEEP versions (whole or delta)."""
    dirs: dict[int, list[Path]] = {}
    for p in parent.iterdir():
        m = _VERSION_DIR.match(p.name)
        if m and p.is_dir():
            dirs.setdefault(int(m.group(1)), []).append(p)
    for version in sorted(dirs)[:-KEEP]:
        for p in dirs[version]:
            shutil.rmtree(p, ignore_errors=True)
