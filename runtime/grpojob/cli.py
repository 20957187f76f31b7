"""`grpojob` command line. Each subcommand imports what it needs only when it runs, so
`grpojob validate` and `grpojob crd` work in the operator image (no torch)."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Optional

from .api import FieldError, InvalidSpec, check, load_file, set_path


def load_manifest(path: str, sets: list[str]) -> dict:
    doc = load_file(path)
    for item in sets or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise InvalidSpec([FieldError(key, "--set needs KEY=VALUE")])
        set_path(doc, key, value)
    return doc


def _errors(path: str, errors) -> int:
    print(f"{path}: invalid GRPOJob", file=sys.stderr)
    for e in errors:
        print(f"  {e}", file=sys.stderr)
    return 1


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        doc = load_manifest(args.file, args.set)
    except InvalidSpec as e:
        return _errors(args.file, e.errors)
    job, errors = check(doc, resolve_plugins=not args.no_resolve)
    if errors:
        return _errors(args.file, errors)
    s = job.spec
    print(f"{args.file}: valid GRPOJob '{job.metadata.name}': {s.algorithm.name}, "
          f"{s.training.steps} steps x {s.training.prompts_per_step} prompts x {s.algorithm.group_size}, "
          f"trainer {s.trainer.replicas}x{s.trainer.processes_per_replica}, "
          f"rollout {s.rollout.replicas}x{s.rollout.backend}")
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from .api.crd import crd_yaml

    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _delegate(target: str) -> Callable[[argparse.Namespace], int]:
    """Run `module:function(args)` of a subsystem that may not be installed in this image."""
    def run(args: argparse.Namespace) -> int:
        module_name, _, fn = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            print(f"grpojob {args.command}: {e.name} is not installed here "
                  f"(install grpojob with the extra this command needs)", file=sys.stderr)
            return 2
        return int(getattr(module, fn)(args) or 0)
    return run


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpojob", description="GRPO reinforcement learning for LLMs, "
                                "on Kubernetes or on one machine.")
    sub = p.add_subparsers(dest="command", required=True)

    def manifest_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", help="GRPOJob manifest (YAML)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, e.g. training.steps=50 (repeatable)")

    sp = sub.add_parser("validate", help="check a manifest; print every error with its field path")
    manifest_args(sp)
    sp.add_argument("--no-resolve", action="store_true", help="do not import module:attr plug-ins")
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("crd", help="print the GRPOJob CustomResourceDefinition")
    sp.add_argument("-o", "--output", help="write to this file")
    sp.set_defaults(fn=cmd_crd)

    sp = sub.add_parser("run", help="run a GRPOJob on this machine")
    manifest_args(sp)
    sp.add_argument("--run-dir", help="run directory (default: runs/<job name>)")
    sp.add_argument("--backend", choices=["hf", "vllm"], help="rollout engine override")
    sp.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    sp.set_defaults(fn=_delegate("grpojob.local.runner:main"))

    sp = sub.add_parser("render", help="print the Kubernetes objects the operator creates for a job")
    manifest_args(sp)
    sp.add_argument("--namespace", default=None, help="namespace (default: the manifest's, else default)")
    sp.add_argument("--image", default=None, help="runtime image (default: the operator's default)")
    sp.set_defaults(fn=_delegate("grpojob_operator.render:main"))

    sp = sub.add_parser("trainer", help="(in pods) the trainer; started by torchrun")
    sp.set_defaults(fn=_delegate("grpojob.trainer.main:main"))

    sp = sub.add_parser("rollout", help="(in pods) a rollout server")
    sp.set_defaults(fn=_delegate("grpojob.rollout.server:main"))

    sp = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    sp.add_argument("-n", "--namespace", action="append", default=[],
                    help="watch these namespaces (default: all)")
    sp.add_argument("--metrics-port", type=int, default=8080)
    sp.add_argument("--liveness", default="http://0.0.0.0:8081/healthz")
    sp.add_argument("--peering", default=None, help="kopf peering name for leader election")
    sp.set_defaults(fn=_delegate("grpojob_operator.main:main"))

    sp = sub.add_parser("tiny", help="build a tiny random model and tokenizer for CPU runs and tests")
    sp.add_argument("output", help="directory to write the model to")
    sp.add_argument("--tie-embeddings", action="store_true")
    sp.set_defaults(fn=_delegate("grpojob.tiny:cli"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except InvalidSpec as e:
        return _errors(getattr(args, "file", "manifest"), e.errors)
    except KeyboardInterrupt:
        return 130
