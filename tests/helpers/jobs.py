"""Building test GRPOJobs from a base spec plus overrides."""
from __future__ import annotations

import copy

from grpojob.api import GRPOJob, parse


def merge(base: dict, over: dict) -> dict:
    """Deep-merge `over` into a copy of `base` (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def job_from(base: dict, model_dir, **over) -> GRPOJob:
    spec = merge(base, over)
    spec["model"]["path"] = str(model_dir)
    return parse({"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "t"},
                  "spec": spec})
