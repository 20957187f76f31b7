"""A per-user cache of the tiny models `grpojob run` builds (the build annotations), so that a second
run in a new directory copies the model instead of importing torch and building (or, for the judges'
models, training) it again.

An entry is keyed by what decides its bytes: the builder, its arguments, the source of the modules
that build it, the corpus, and the installed torch/transformers/tokenizers/safetensors. Where the cache
cannot be written (a read-only home, as under OpenShift's random user) the model is built in place,
as before. GRPOJOB_CACHE_DIR names the cache's folder; set to "off" it is not used.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as md
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

ENV_CACHE_DIR = "GRPOJOB_CACHE_DIR"
_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors")
_HERE = Path(__file__).parent
# what every builder's bytes depend on besides its own module (grpojob.judge.tiny trains on the toy task)
_SOURCES = (_HERE / "tiny.py", _HERE / "assets" / "corpus.txt", _HERE / "data" / "builtin.py")


def cache_dir() -> Optional[Path]:
    """The cache's folder; None when turned off."""
    named = os.environ.get(ENV_CACHE_DIR)
    if named is not None:
        return None if named.strip().lower() in ("", "off") else Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grpojob"


def key(builder: Callable[..., Any], **kw: Any) -> str:
    """The entry's name: the builder's name and a digest of all that decides the model's bytes."""
    h = hashlib.sha256()
    h.update(f"{builder.__module__}.{builder.__qualname__}".encode())
    h.update(json.dumps(kw, sort_keys=True, default=str).encode())
    for path in (Path(inspect.getsourcefile(builder)), *_SOURCES):
        h.update(path.read_bytes() if path.exists() else b"-")
    for name in _PACKAGES:
        try:
            h.update(f"{name}={md.version(name)}".encode())
        except md.PackageNotFoundError:
            h.update(f"{name}=-".encode())
    return f"{builder.__name__}-{h.hexdigest()[:16]}"


def build(builder: Callable[..., Any], output: str | Path, **kw: Any) -> tuple[Path, bool]:
    """builder(output, **kw) through the cache. Returns (output, whether it came from the cache)."""
    output = Path(output)
    root = cache_dir()
    if root is None:
        builder(output, **kw)
        return output, False
    entry = root / "tiny-models" / key(builder, **kw)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = open(entry.parent / f"{entry.name}.lock", "a")
    except OSError as e:  # not writable here: build in place, as without a cache
        print(f"grpojob: model cache {root} not writable ({e}); building in place", file=sys.stderr)
        builder(output, **kw)
        return output, False
    hit = fill(entry, lock, lambda staging: builder(staging, **kw))
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(entry, output, dirs_exist_ok=True)
    return output, hit


def fill(entry: Path, lock, make: Callable[[Path], Any]) -> bool:
    """make(a staging folder) once into `entry` (a folder with a config.json), under `lock` (an open
    file beside it): another process waits, then finds it whole. Returns whether it was there."""
    with lock:  # one builder per entry at a time: another process waits (a judge trains ~1 min)
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = (entry / "config.json").exists()
        if not hit:
            shutil.rmtree(entry, ignore_errors=True)  # an entry without its config: left by a crash
            staging = Path(tempfile.mkdtemp(prefix=entry.name + ".", dir=entry.parent))
            try:
                make(staging)
                os.rename(staging, entry)  # whole or absent, whoever reads it
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return hit
