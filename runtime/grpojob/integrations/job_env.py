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


def json_lines(path: str, flag: str = "--data") -> list:
    """The JSON values of a .jsonl file named by `flag`: as given (relative to the working directory),
    else under spec.code's directory (GRPOJOB_CODE_DIR: in a pod, the ConfigMap that brought the
    environment's files, while the working directory is the image's); SystemExit naming both places."""
    places = [Path(path)]
    if not Path(path).is_absolute() and os.environ.get("GRPOJOB_CODE_DIR"):
        places.append(Path(os.environ["GRPOJOB_CODE_DIR"]) / path)
    found = next((p for p in places if p.is_file()), None)
    if found is None:
        raise SystemExit(f"{flag} {path}: no such file (looked in {', '.join(str(p.absolute()) for p in places)})")
    try:
        return [json.loads(line) for line in found.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{flag} {found}: not JSON lines ({e})") from None
