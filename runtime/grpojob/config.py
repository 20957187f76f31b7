"""How a runtime process finds its job: the file named by GRPOJOB_CONFIG (nothing else)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from grpojob.api import GRPOJob, parse
from grpojob.api.validate import check_plugins
from grpojob.failures import PluginError
from grpojob.plan import ENV_CONFIG


def load(path: str | os.PathLike | None = None, resolve_plugins: bool = True) -> GRPOJob:
    """The job; with resolve_plugins, PluginError (field paths) when a plug-in does not import."""
    path = path or os.environ.get(ENV_CONFIG)
    if not path:
        raise SystemExit(f"{ENV_CONFIG} is not set: it must name the job's runtime config file")
    job = parse(json.loads(Path(path).read_text()))
    if resolve_plugins:
        load_plugins(job)
    return job


def load_plugins(job: GRPOJob) -> None:
    """Import every plug-in the job names (PluginError with every failure's field path)."""
    errors = check_plugins(job)
    if errors:
        raise PluginError(errors)
