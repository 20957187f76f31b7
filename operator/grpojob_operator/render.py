"""`grpojob render FILE`: the child objects the operator would create, as a YAML stream (for review
and GitOps). Owner references are left out: they need the live job's uid. The job's Secret comes
without its token (the operator makes the token when it creates the Secret); the operator's
settings the children depend on (its namespace, the monitoring namespaces, metrics auth) are read
from the same environment variables the operator reads (grpojob_operator.config)."""
from __future__ import annotations

import argparse
import sys

import yaml

from grpojob.api import InvalidSpec, check, load_manifest

from . import children
from .config import OperatorConfig


def render(doc: dict, namespace: str, image: str | None = None) -> str:
    doc = dict(doc)
    doc["metadata"] = {**(doc.get("metadata") or {}), "namespace": namespace}
    job, errors = check(doc, resolve_plugins=False)
    if job is None or errors:
        raise InvalidSpec(errors)
    errors = children.cluster_errors(job)
    if errors:
        raise InvalidSpec(errors)
    cluster = OperatorConfig.from_env().cluster
    objs = [children.token_secret(job.metadata.name, namespace, None, None),
            *children.build(job, namespace=namespace, image=image, cluster=cluster)]
    return yaml.safe_dump_all(objs, sort_keys=False)


def main(args: argparse.Namespace) -> int:
    doc = load_manifest(args.file, args.set)
    # --namespace wins, then the file's namespace, then "default" (as kubectl apply does).
    namespace = args.namespace or (doc.get("metadata") or {}).get("namespace") or "default"
    sys.stdout.write(render(doc, namespace, args.image))
    return 0
