"""Checkpoints: a Hugging Face model directory (safetensors + tokenizer: loadable by transformers
and vLLM) plus the trainer state (optimizer, scheduler, RNG and data position of every rank).

Layout under the checkpoint directory:
    step-000010/
        model/            config.json, model.safetensors, tokenizer files
        trainer_state.pt  step, policy version, optimizer, scheduler, per-rank RNG and data state
A checkpoint is written into a hidden temporary directory and renamed into place when complete,
so the newest `step-*` directory is always whole, even after a kill mid-save. Only rank 0 writes
(other ranks' small states are gathered to it), so no shared filesystem is needed to save.
"""
from __future__ import annotations

import logging
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import torch

log = logging.getLogger("grpojob.checkpoint")

STEP_DIR = re.compile(r"^step-(\d+)$")
MODEL_DIR = "model"
STATE_FILE = "trainer_state.pt"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:06d}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / STATE_FILE).is_file() and (p / MODEL_DIR / "config.json").is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest(root: str | Path) -> Optional[Path]:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: str | Path, step: int, *, model, model_state: dict[str, torch.Tensor], tokenizer,
         trainer_state: dict[str, Any], keep_last: int) -> Path:
    """Write step-NNNNNN (rank 0 only). `model` gives the config for save_pretrained; the weights
    are `model_state` (the full, unsharded HF-named state dict)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp-{final.name}-{time.time_ns()}"
    t0 = time.perf_counter()
    try:
        model.save_pretrained(tmp / MODEL_DIR, state_dict=model_state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / MODEL_DIR)
        torch.save(trainer_state, tmp / STATE_FILE)
        if final.exists():  # a re-run of the same step (e.g. resumed at the end) replaces it
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    prune(root, keep_last)
    log.info("checkpoint saved", extra={"step": step, "path": str(final),
                                        "seconds": round(time.perf_counter() - t0, 3)})
    return final


def prune(root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints, and leftovers of interrupted saves."""
    root = Path(root)
    removed = []
    for _, p in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in root.glob(".tmp-step-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def load_state(path: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint directory."""
    return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)  # no pickled code


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint directory (HF names), from its safetensors files."""
    from safetensors.torch import load_file

    files = sorted((Path(path) / MODEL_DIR).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path}: no safetensors weights in {MODEL_DIR}/")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
