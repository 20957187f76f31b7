"""A checkpoint as a Hugging Face model directory, on request (`grpojob export CHECKPOINT OUT`):
config and tokenizer from the checkpoint's hf/, the weights read tensor by tensor from the
torch.distributed.checkpoint shards (each one assembled from every rank's pieces) and streamed
into model.safetensors, so the process holds one tensor at a time, whatever the model's size.
No process group is needed: any machine that mounts the checkpoint (or reaches its object
store) can run it.

A LoRA checkpoint exports its adapter in PEFT's format (adapter_config.json,
adapter_model.safetensors, plus the tokenizer), or with `merged` the base model with the adapter
merged in (PEFT's merge_and_unload), a plain Hugging Face model directory."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import torch

from grpojob import gguf_model
from grpojob.api.model_file import is_gguf
from grpojob.sync import adapter
from grpojob.sync.tensorfiles import write_safetensors
from grpojob.sync.stream import TensorStream
from grpojob.checkpoint import layout, manager, objects  # noqa: F401 - manager: DCP's single-process warning filtered

# Flattened DCP keys of the policy's weights: the state dict's "model" entry, whose keys are the
# trainer's PolicyLogprobs names ("model." + the Hugging Face name).
WEIGHTS_PREFIX = "model.model."


class ExportError(ValueError):
    """A request the checkpoint cannot satisfy; the message says what to do."""


def export(checkpoint: str | Path, out: str | Path, *, merged: bool = False, base: Optional[str] = None) -> Path:
    """Write `out` (config, tokenizer, model.safetensors) from a checkpoint directory or an object
    store's checkpoint URL; LoRA: the adapter, or with `merged` the merged model (`base`: the base
    model dir, default the adapter's)."""
    from torch.distributed.checkpoint import FileSystemReader

    if objects.is_store(str(checkpoint)) and not isinstance(checkpoint, Path):
        return _export_from_store(str(checkpoint), Path(out), merged, base)
    checkpoint, out = Path(checkpoint), Path(out)
    if (checkpoint / layout.ADAPTER_DIR).is_dir():
        return _export_lora(checkpoint, out, merged, base)
    if merged:
        raise ExportError(f"{checkpoint}: --merged is for LoRA checkpoints; this one holds the full model")
    if layout.is_legacy(checkpoint):  # the full-state layout holds a Hugging Face directory already
        shutil.copytree(checkpoint / layout.LEGACY_MODEL_DIR, out, dirs_exist_ok=True)
        return out
    if layout.is_per_pod(checkpoint):
        return _export_per_pod(checkpoint, out)
    if not layout.is_sharded(checkpoint):
        raise FileNotFoundError(f"{checkpoint}: not a complete checkpoint (no {layout.SHARDS}/.metadata)")
    shards = str(checkpoint / layout.SHARDS)
    return _export_weights(lambda: FileSystemReader(shards), checkpoint / layout.HF_DIR, out)


def _export_per_pod(checkpoint: Path, out: Path) -> Path:
    """A checkpoint saved on a claim per trainer pod (checkpoint/pods.py): each rank's own DCP
    checkpoint under state/rank-NNNNN/. A tensor is read from every rank's part that holds a
    piece of it; the pod of rank 0 holds whole copies of replicated weights (DDP), while FSDP's
    shards need every pod's state/rank-* copied beside these."""
    from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

    if not (checkpoint / layout.HF_DIR / "config.json").is_file():
        raise ExportError(f"{checkpoint}: this pod's part of a checkpoint on per-pod claims has no hf/ (the pod of "
                          f"trainer rank 0 has it): export that pod's checkpoint")
    parts = sorted(p for p in (checkpoint / layout.SHARDS).glob("rank-*") if (p / ".metadata").is_file())
    metas = [FileSystemReader(str(p)).read_metadata().state_dict_metadata for p in parts]
    pieces: dict[str, list[int]] = {}
    for i, meta in enumerate(metas):
        for key, md in meta.items():
            if key.startswith(WEIGHTS_PREFIX) and isinstance(md, TensorStorageMetadata):
                pieces.setdefault(key, []).append(i)
    missing = [k[len(WEIGHTS_PREFIX):] for k, owners in pieces.items()
               if sum(_volume(c.sizes) for i in owners for c in metas[i][k].chunks) < _volume(metas[owners[0]][k].size)]
    if missing:
        ranks = json.loads((checkpoint / layout.POD_FILE).read_text()).get("pods")
        raise ExportError(f"{checkpoint}: these ranks' parts hold only shards of {missing[0]} (and {len(missing) - 1} "
                          f"more weights): the checkpoint is spread over the trainer pods' claims (ranks per pod: "
                          f"{ranks}); copy every pod's {checkpoint.name}/{layout.SHARDS}/rank-* into "
                          f"{checkpoint / layout.SHARDS} and export again")
    return _export_weights(lambda: _Pieces(parts, pieces), checkpoint / layout.HF_DIR, out)


def _volume(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


class _Pieces:
    """What _export_weights asks of a DCP reader, over the rank parts of a per-pod checkpoint:
    the union of their metadata, and a load that fills a tensor from every part with a piece."""

    def __init__(self, parts: list[Path], pieces: dict[str, list[int]]):
        self.parts, self.pieces = parts, pieces

    def read_metadata(self):
        from torch.distributed.checkpoint import FileSystemReader

        merged = None
        for p in self.parts:
            meta = FileSystemReader(str(p)).read_metadata()
            if merged is None:
                merged = meta
            else:
                for k, v in meta.state_dict_metadata.items():
                    merged.state_dict_metadata.setdefault(k, v)
        return merged

    def load(self, box: dict) -> None:
        from torch.distributed.checkpoint import FileSystemReader, load

        (key,) = box
        for i in self.pieces[key]:
            load(box, storage_reader=FileSystemReader(str(self.parts[i])), no_dist=True)


def _export_from_store(url: str, out: Path, merged: bool, base: Optional[str]) -> Path:
    """The checkpoint's hf/ (and adapter/) copied here; the weights read from the store tensor by tensor."""
    import tempfile

    from grpojob.checkpoint.store_dcp import StoreReader

    store = objects.Store(url.rstrip("/").rsplit("/", 1)[0])
    if not store.is_complete(url):
        raise FileNotFoundError(f"{url}: not a complete checkpoint (no {objects.MARKER} marker)")
    with tempfile.TemporaryDirectory(prefix="grpojob-export-") as tmp:
        local = Path(tmp)
        store.download(url, local, (layout.HF_DIR, layout.ADAPTER_DIR))
        if (local / layout.ADAPTER_DIR).is_dir():
            return _export_lora(local, out, merged, base)
        if merged:
            raise ExportError(f"{url}: --merged is for LoRA checkpoints; this one holds the full model")
        name = store.name_of(url)
        return _export_weights(lambda: StoreReader(store.store, f"{name}/{layout.SHARDS}"), local / layout.HF_DIR, out)


def _export_weights(reader, hf: Path, out: Path) -> Path:
    """model.safetensors from the shards `reader()` reads (one tensor at a time), and hf/'s files."""
    from torch.distributed.checkpoint import TensorStorageMetadata, load

    meta = reader().read_metadata().state_dict_metadata
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
        r = reader()
        if isinstance(r, _Pieces):
            r.load(box)
        else:
            load(box, storage_reader=r, no_dist=True)
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
        if is_gguf(base):  # --base as spec.model.path named it: its converted folder
            base = str(gguf_model.folder(base))
        if not base or not Path(base).is_dir():
            raise ExportError(f"--merged needs the base model: '{base}' is not a directory; pass --base DIR")
        # float32 whatever the base's dtype: an adapter's update is below bfloat16's resolution of
        # the base weights (a bf16 merge of SmolLM2's converted folder moved its logits by 0.26)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
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

    src = args.checkpoint if objects.is_store(args.checkpoint) else Path(args.checkpoint)
    if objects.is_store(str(src)):  # a checkpoint's URL, or the URL holding them (its newest)
        store = objects.Store(str(src))
        if not objects.STEP.match(store.name_of(str(src))) or not \
                objects.Store(str(src).rstrip("/").rsplit("/", 1)[0]).is_complete(str(src)):
            src = store.latest()
            if src is None:
                print(f"grpojob export: {args.checkpoint} is neither a complete checkpoint nor a URL holding one",
                      file=sys.stderr)
                return 1
    elif not layout.is_complete(src):
        newest = layout.latest(src)
        if newest is None:
            print(f"grpojob export: {src} is neither a complete checkpoint nor a directory holding one",
                  file=sys.stderr)
            return 1
        src = newest
    try:
        out = export(src, args.output, merged=args.merged, base=args.base)
    except (ExportError, FileNotFoundError, gguf_model.ConversionError) as e:
        print(f"grpojob export: {e}", file=sys.stderr)
        return 1
    print(f"exported {src} to {out}")
    return 0
