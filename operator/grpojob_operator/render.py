"""`grpojob render FILE`: the child objects the operator would create, as a YAML stream (for review
and GitOps). Owner references are left out: they need the live job's uid."""
from __future__ import annotations

import argparse
import sys

import yaml

from grpojob.api import InvalidSpec, check, load_manifest

from . import children


def render(doc: dict, namespace: str, image: str | None = None) -> str:
    doc = dict(doc)
    doc["metadata"] = {**(doc.get("metadata") or {}), "namespace": namespace}
    job, errors = check(doc, resolve_plugins=False)
    if job is None or errors:
        raise InvalidSpec(errors)
    errors = children.cluster_errors(job)
    if errors:
        raise InvalidSpec(errors)
    objs = children.build(job, namespace=namespace, image=image)
    return yaml.safe_dump_all(objs, sort_keys=False)


def main(args: argparse.Namespace) -> int:
    doc = load_manifest(args.file, args.set)
    # --namespace wins, then the file's namespace, then "default" (as kubectl apply does).
    namespace = args.namespace or (doc.get("metadata") or {}).get("namespace") or "default"
    sys.stdout.write(render(doc, namespace, args.image))
    return 0
