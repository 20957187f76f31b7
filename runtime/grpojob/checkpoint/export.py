"""A checkpoint as a Hugging Face model directory, on request (`grpojob export CHECKPOINT OUT`):
config and tokenizer from the checkpoint's hf/, the weights read tensor by tensor from the
torch.distributed.checkpoint shards (each one assembled from every rank's pieces) and streamed
into model.safetensors, so the process holds one tensor at a time, whatever the model's size.
No process group is needed: any machine that mounts the checkpoint can run it.

A LoRA checkpoint exports its adapter in PEFT's format (adapter_config.json,
adapter_model.safetensors, plus the tokenizer), or with `merged` the base model with the adapter
merged in (PEFT's merge_and_unload), a plain Hugging Face model directory."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import torch

from grpojob.sync import adapter
from grpojob.sync.tensorfiles import write_safetensors
from grpojob.sync.stream import TensorStream
from grpojob.checkpoint import layout, manager  # noqa: F401 - manager: DCP's single-process warning filtered

# Flattened DCP keys of the policy's weights: the state dict's "model" entry, whose keys are the
# trainer's PolicyLogprobs names ("model." + the Hugging Face name).
WEIGHTS_PREFIX = "model.model."


class ExportError(ValueError):
    """A request the checkpoint cannot satisfy; the message says what to do."""


def export(checkpoint: str | Path, out: str | Path, *, merged: bool = False, base: Optional[str] = None) -> Path:
    """Write `out` (config, tokenizer, model.safetensors) from a checkpoint directory; LoRA: the
    adapter, or with `merged` the merged model (`base`: the base model dir, default the adapter's)."""
    from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata, load

    checkpoint, out = Path(checkpoint), Path(out)
    if (checkpoint / layout.ADAPTER_DIR).is_dir():
        return _export_lora(checkpoint, out, merged, base)
    if merged:
        raise ExportError(f"{checkpoint}: --merged is for LoRA checkpoints; this one holds the full model")
    if layout.is_legacy(checkpoint):  # the full-state layout holds a Hugging Face directory already
        shutil.copytree(checkpoint / layout.LEGACY_MODEL_DIR, out, dirs_exist_ok=True)
        return out
    if not layout.is_sharded(checkpoint):
        raise FileNotFoundError(f"{checkpoint}: not a complete checkpoint (no {layout.SHARDS}/.metadata)")
    shards = str(checkpoint / layout.SHARDS)
    meta = FileSystemReader(shards).read_metadata().state_dict_metadata
    hf = checkpoint / layout.HF_DIR
    config = json.loads((hf / "config.json").read_text())
    specs = []
    for key, md in meta.items():
        if key.startswith(WEIGHTS_PREFIX) and isinstance(md, TensorStorageMetadata):
            name = key[len(WEIGHTS_PREFIX):]
            if name == "lm_head.weight" and config.get("tie_word_embeddings"):
                continue  # the loader ties it to the input embeddings again
            specs.append((name, tuple(md.size), md.properties.dtype))

    by_name = {name: (shape, dtype) for name, shape, dtype in specs}

    def fetch(name: str) -> torch.Tensor:
        shape, dtype = by_name[name]
        box = {WEIGHTS_PREFIX + name: torch.empty(shape, dtype=dtype)}
        load(box, storage_reader=FileSystemReader(shards), no_dist=True)
        return box[WEIGHTS_PREFIX + name]

    out.mkdir(parents=True, exist_ok=True)
    for f in hf.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    write_safetensors(out / "model.safetensors", TensorStream(specs, fetch))
    return out


def _export_lora(checkpoint: Path, out: Path, merged: bool, base: Optional[str]) -> Path:
    src, hf = checkpoint / layout.ADAPTER_DIR, checkpoint / layout.HF_DIR
    out.mkdir(parents=True, exist_ok=True)
    if merged:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = base or json.loads((src / adapter.CONFIG).read_text()).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise ExportError(f"--merged needs the base model: '{base}' is not a directory; pass --base DIR")
        model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
        PeftModel.from_pretrained(model, str(src)).merge_and_unload().save_pretrained(out)
    else:
        for f in (adapter.CONFIG, adapter.WEIGHTS):
            shutil.copy2(src / f, out / f)
    for f in hf.iterdir():  # the tokenizer (and, merged, nothing that save_pretrained wrote)
        if f.is_file() and not (out / f.name).exists():
            shutil.copy2(f, out / f.name)
    return out


def main(args) -> int:
    """`grpojob export`: a checkpoint directory (or a checkpoint root: its newest) to a model dir."""
    import sys

    src = Path(args.checkpoint)
    if not layout.is_complete(src):
        newest = layout.latest(src)
        if newest is None:
            print(f"grpojob export: {src} is neither a complete checkpoint nor a directory holding one",
                  file=sys.stderr)
            return 1
        src = newest
    try:
        out = export(src, args.output, merged=args.merged, base=args.base)
    except ExportError as e:
        print(f"grpojob export: {e}", file=sys.stderr)
        return 1
    print(f"exported {src} to {out}")
    return 0
