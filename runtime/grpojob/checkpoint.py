"""Checkpoints: a Hugging Face model directory (safetensors + tokenizer: loadable by transformers
and vLLM) plus the trainer state (optimizer, scheduler, every rank's RNG, and the rollout side's
data position with the prompts issued but not yet trained).

Layout under the checkpoint directory:
    step-000010/
        model/            config.json, model.safetensors, tokenizer files
        trainer_state.pt  step, policy version, optimizer, scheduler, per-rank RNG, data state
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
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:  # the trainer package imports torch.distributed; checkpoint helpers stay light
    from .trainer.rollouts import GroupSource
    from .trainer.trainer import GRPOTrainer

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


def save(root: str | Path, step: int, *, export, trainer_state: dict[str, Any], keep_last: int) -> Path:
    """Write step-NNNNNN (rank 0 only): `export(dir)` writes the Hugging Face model directory."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".tmp-{final.name}-{time.time_ns()}"
    t0 = time.perf_counter()
    try:
        export(tmp / MODEL_DIR)
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


def find_latest(root: str | Path, env) -> Optional[Path]:
    """The newest complete checkpoint, as rank 0 sees it (collective)."""
    from .trainer import dist

    found = latest(root) if env.is_leader else None
    found = dist.broadcast_object(str(found) if found else None, env)
    return Path(found) if found else None


class CheckpointManager:
    """Saves and restores everything a run needs to continue exactly: the policy (as a Hugging Face
    model), optimizer, LR schedule, step and policy version, every rank's RNG, and the group
    source's data position and rollout buffer (prompts issued but not trained are generated again
    after a resume, so none is skipped or trained twice). save and load are collective."""

    def __init__(self, root: str | Path, trainer: "GRPOTrainer", source: "GroupSource", keep_last: int):
        self.root, self.trainer, self.source, self.keep_last = Path(root), trainer, source, keep_last
        self.last_step: Optional[int] = None

    def save(self) -> Optional[Path]:
        from .trainer import dist

        tr = self.trainer
        weights, optimizer = tr.full_state(optimizer=True)
        ranks = dist.gather_objects({"rng": rng_state()}, tr.env)
        path = None
        if tr.env.is_leader:
            state = {"step": tr.step, "policy_version": tr.version, "optimizer": optimizer,
                     "scheduler": tr.scheduler.state_dict(), "ranks": ranks, "world": tr.env.world,
                     "data": self.source.state_dict()}
            path = save(self.root, tr.step, export=lambda p: tr.export_model(p, weights), trainer_state=state,
                        keep_last=self.keep_last)
        dist.barrier(tr.env)
        self.last_step = tr.step
        return path

    def load(self, path: Path) -> None:
        from .trainer import dist

        tr = self.trainer
        weights = optimizer = state = None
        if tr.env.is_leader:
            state = load_state(path)
            weights = load_model_state(path)
            optimizer = state.pop("optimizer")
        tr.load_state(weights, optimizer)
        state = dist.broadcast_object(state, tr.env)
        tr.scheduler.load_state_dict(state["scheduler"])
        tr.step, tr.version = int(state["step"]), int(state["policy_version"])
        self.source.load_state_dict(state.get("data") or {})
        if state.get("world") == tr.env.world:  # RNG streams are per rank: only for the same world size
            set_rng_state(state["ranks"][tr.env.rank]["rng"])
        self.last_step = tr.step
        log.info("resumed", extra={"path": str(path), "step": tr.step})
