"""How a runtime process finds its job: the file named by GRPOJOB_CONFIG (nothing else)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .api import GRPOJob, parse
from .plan import ENV_CONFIG


def load(path: str | os.PathLike | None = None) -> GRPOJob:
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise SystemExit(f"{ENV_CONFIG} is not set: it must name the job's runtime config file")
    return parse(json.loads(Path(path).read_text()), resolve_plugins=True)
