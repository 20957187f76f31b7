"""The full-state checkpoint layout written before sharded checkpoints: step-N/model/ (a Hugging
Face model directory: the weights, gathered on rank 0) and trainer_state.pt, whose "optimizer"
holds the full optimizer state. Such a checkpoint still resumes: rank 0 reads it and the state is
broadcast into this run's sharding (trainer.load_state). The next save is sharded."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from grpojob.checkpoint import layout


def read_state(path: str | Path) -> dict[str, Any]:
    """A checkpoint's trainer_state.pt (either layout); tensors and plain data only, no pickled code."""
    return torch.load(Path(path) / layout.STATE_FILE, map_location="cpu", weights_only=True)


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The model weights of a full-state checkpoint (HF names), from its safetensors files."""
    from safetensors.torch import load_file

    files = sorted((Path(path) / layout.LEGACY_MODEL_DIR).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {path}: no safetensors weights in {layout.LEGACY_MODEL_DIR}/")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load(trainer, path: str | Path) -> Optional[dict[str, Any]]:
    """Load a full-state checkpoint into the learner (checkpoint.manager.Learner; collective); its trainer state on rank 0
    (None elsewhere), without the optimizer."""
    weights = optimizer = state = None
    if trainer.env.is_leader:
        state = read_state(path)
        weights = load_model_state(path)
        optimizer = state.pop("optimizer")
    trainer.load_state(weights, optimizer)
    return state
