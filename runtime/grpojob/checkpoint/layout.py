"""Where checkpoints live and when one counts. No torch here: the local runner reads it too.

    <root>/
        step-000010/              a complete checkpoint (renamed into place once whole)
            state/                torch.distributed.checkpoint: .metadata and every rank's shards
                                  (model and optimizer state)
            trainer_state.pt      rank 0's: step, policy version, world size, LR schedule, every
                                  rank's RNG, the data position and the rollout buffer
            hf/                   the model's config and tokenizer (weights: `grpojob export`)
            adapter/              LoRA: the adapter in PEFT's format (adapter_config.json,
                                  adapter_model.safetensors); state/ then holds only the
                                  adapter and its optimizer state (the base is spec.model.path)
        latest                    the name of the newest committed checkpoint
        .tmp-step-000012-<ns>/    a save in progress, or one killed before its commit (the next
                                  commit removes it)

On a claim per trainer pod (directories no two pods share: checkpoint.pods) each pod's step
directory holds its own ranks' part: state/rank-NNNNN/ (each rank's own DCP checkpoint: its
shards and .metadata) and pod.json (the world size and the ranks of every pod); the pod of rank 0
also has trainer_state.pt and hf/.

A save writes into the temporary directory and commits by renaming it to step-NNNNNN, then moves
`latest`: a save killed at any point leaves the previous checkpoint whole and `latest` naming it.
Checkpoints of the earlier full-state layout (step-N/model/ with the Hugging Face weights, and a
trainer_state.pt holding the full optimizer state) count as complete too (see `legacy`).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Optional

STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-step-"
SHARDS = "state"
STATE_FILE = "trainer_state.pt"
HF_DIR = "hf"
ADAPTER_DIR = "adapter"
LEGACY_MODEL_DIR = "model"
LATEST = "latest"
POD_FILE = "pod.json"  # a pod's part of a checkpoint on per-pod claims


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def temp_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{TMP_PREFIX}{step:06d}-{time.time_ns()}"


def is_sharded(path: str | Path) -> bool:
    return (Path(path) / SHARDS / ".metadata").is_file()


def is_per_pod(path: str | Path) -> bool:
    return (Path(path) / POD_FILE).is_file()


def rank_dir(path: str | Path, rank: int) -> Path:
    """A rank's own DCP checkpoint inside a per-pod checkpoint."""
    return Path(path) / SHARDS / f"rank-{rank:05d}"


def is_legacy(path: str | Path) -> bool:
    return not is_sharded(path) and (Path(path) / LEGACY_MODEL_DIR / "config.json").is_file()


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    if is_per_pod(path):  # renamed into place once every rank of every pod had written
        return True
    return (path / STATE_FILE).is_file() and (is_sharded(path) or is_legacy(path))


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and is_complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest(root: str | Path) -> Optional[Path]:
    """The newest complete checkpoint (what `latest` names, unless a kill came between a commit's
    rename and the move of `latest`: the renamed checkpoint is whole, so it wins)."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def commit(root: str | Path, tmp: Path, final: Path, keep_last: int, prune_now: bool = True) -> None:
    """Rename a whole temporary checkpoint into place, move `latest` to it, prune (unless
    `prune_now` is False: per-pod claims prune once every pod has committed)."""
    root = Path(root)
    _fsync(tmp)
    if final.exists():  # a re-save of the same step (a resumed run ending where it resumed)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / LATEST)
    _fsync(root)
    if prune_now:
        prune(root, keep_last)


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints, and leftovers of interrupted saves (call
    it only when no save is in progress)."""
    root = Path(root)
    removed = []
    for _, p in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in root.glob(TMP_PREFIX + "*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _fsync(directory: Path) -> None:
    """Make a rename durable (the files in it were synced by their writers)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory: the rename stands anyway
        pass
    finally:
        os.close(fd)
