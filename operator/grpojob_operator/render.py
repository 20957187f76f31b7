"""`grpojob render FILE`: the child objects the operator would create, as a YAML stream (for review,
and for GitOps without the operator: docs/helm.md, "GitOps"). Owner references are left out: they
need the live job's uid. The operator's settings the children depend on (its namespace, the
monitoring namespaces, metrics auth) are read from the same environment variables the operator
reads (grpojob_operator.config).

The job's token: every pod mounts the Secret `<job>-token`. A GitOps repository should hold no
secret, so by default the output holds no Secret; its header says how to make it (one command, or
a secret store), and the pods wait (their token volume cannot mount) until it exists. `--token`
puts a Secret with a fresh random token into the output, so it applies as it is; that output then
holds a secret, to be kept out of git in the clear (seal or encrypt it). Never an empty Secret: one
that is immutable could never be filled, one that is not would be a token anyone could write.
"""
from __future__ import annotations

import argparse
import sys

import yaml

from grpojob import auth
from grpojob.api import InvalidSpec, check, load_manifest

from . import children
from . import names as n
from .config import OperatorConfig

RENDERED_TOKEN_NOTE = ("made by grpojob render --token: this output holds the job's token; keep it out of git in "
                       "the clear (seal or encrypt it)")


def token_instructions(job: str, namespace: str) -> str:
    """The header of an output without a Secret: what the pods need and the ways to make it."""
    secret = n.token_name(job)
    return "\n".join([
        f"# grpojob render: the objects the operator creates for GRPOJob {namespace}/{job}, without owner references.",
        f"# Every pod mounts the Secret {namespace}/{secret} (key {auth.TOKEN_KEY!r}: the job's token), which this "
        "output does not hold:",
        "# no secret belongs in git. The pods wait until it exists. Make it once (a random token of 32 bytes or more):",
        f"#   kubectl -n {namespace} create secret generic {secret} "
        f"--from-literal={auth.TOKEN_KEY}=\"$(openssl rand -base64 32)\"",
        "# or from a secret store (Sealed Secrets, External Secrets, SOPS) under that name and key, or render with",
        "# --token to put a fresh one into this output. See docs/helm.md, \"GitOps\".",
        ""])


def render(doc: dict, namespace: str, image: str | None = None, token: bool = False) -> str:
    doc = dict(doc)
    doc["metadata"] = {**(doc.get("metadata") or {}), "namespace": namespace}
    job, errors = check(doc, resolve_plugins=False)
    if job is None or errors:
        raise InvalidSpec(errors)
    errors = children.cluster_errors(job)
    if errors:
        raise InvalidSpec(errors)
    cluster = OperatorConfig.from_env().cluster
    objs = children.build(job, namespace=namespace, image=image, cluster=cluster)
    name = job.metadata.name
    ckpt = job.spec.checkpoint.credentials_secret
    data = "".join(f"# The trainer pods read Secret {namespace}/{secret} ("
                   + ("spec.checkpoint.credentialsSecret: the checkpoint store's" if secret == ckpt else
                      "spec.dataset.credentialsSecret: the data store's")
                   + " credentials, docs/data.md), which this output does not hold either.\n"
                   for secret in children.dataset_secrets(job))
    if token:
        secret = children.token_secret(name, namespace, None, auth.generate(), note=RENDERED_TOKEN_NOTE)
        return data + yaml.safe_dump_all([secret, *objs], sort_keys=False)
    return token_instructions(name, namespace) + data + yaml.safe_dump_all(objs, sort_keys=False)


def main(args: argparse.Namespace) -> int:
    doc = load_manifest(args.file, args.set)
    # --namespace wins, then the file's namespace, then "default" (as kubectl apply does).
    namespace = args.namespace or (doc.get("metadata") or {}).get("namespace") or "default"
    token = bool(getattr(args, "token", False))
    out = render(doc, namespace, args.image, token)
    sys.stdout.write(out)
    name = (doc.get("metadata") or {}).get("name", "")
    if token:
        print(f"grpojob render: the output holds Secret {namespace}/{n.token_name(name)} with a fresh token: keep it "
              "out of git in the clear", file=sys.stderr)
    else:
        print(f"grpojob render: the pods need Secret {namespace}/{n.token_name(name)}, not in the output: its header "
              "says how to make it", file=sys.stderr)
    return 0
