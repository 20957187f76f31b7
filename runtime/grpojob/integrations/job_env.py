"""What an environment process started by a GRPOJob (spec.environments) reads from its environment:
the job's token and the job's manifest. Shared by the adapters that run as such processes."""
from __future__ import annotations

import json
import os
from pathlib import Path


def token() -> str:
    """The job's token: GRPOJOB_TOKEN_FILE (what the job gives its environments), else OPENAI_API_KEY."""
    path = os.environ.get("GRPOJOB_TOKEN_FILE")
    if path:
        return Path(path).read_text().strip()
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        raise SystemExit("neither GRPOJOB_TOKEN_FILE nor OPENAI_API_KEY is set: the job's token is needed "
                         "(spec.environments get GRPOJOB_TOKEN_FILE from the job)")
    return key


def config() -> dict:
    """The job's manifest (GRPOJOB_CONFIG), or {} where none is given."""
    path = os.environ.get("GRPOJOB_CONFIG")
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}
