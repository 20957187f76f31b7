"""Weights as safetensors files: the checkpoint backend's transport, and loading a model directory.

With `weightSync.backend: checkpoint` the publisher writes each pushed version under
`<checkpoint dir>/rollout-weights/v<version>/` (written to a temporary name, then renamed, so a
reader never sees half a version) and the rollout servers, which mount the same volume, load it.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import torch

SUBDIR = "rollout-weights"
KEEP = 3  # versions kept: a slow server may still be reading the previous one


def save(root: str | os.PathLike, version: int, named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Write one version; returns its path relative to `root`."""
    from safetensors.torch import save_file

    rel = f"{SUBDIR}/v{version:09d}"
    final = Path(root) / rel
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({n: t.detach().contiguous().cpu() for n, t in named}, str(tmp / "model.safetensors"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    versions = sorted(p for p in final.parent.iterdir() if p.is_dir() and not p.name.endswith(".tmp"))
    for old in versions[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return rel


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
