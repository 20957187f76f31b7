"""Names of the built-in plug-ins, the reference rule for everything else, and the one resolver.

A spec names a built-in by name, or user code by reference:
- `module:attr` (dotted on both sides), imported from the Python path;
- `path/to/file.py:attr`, loaded from that file. A relative path is relative to the code directory
  (GRPOJOB_CODE_DIR: spec.code's mount in pods, spec.code.localPath with `grpojob run`) when there is
  one, else to the current directory.

This is the one list of built-in names: the spec validates against it without importing torch,
and each runtime registry asserts it implements exactly these names.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

BUILTIN_ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp")
BUILTIN_REWARDS = ("math_exact", "format", "countdown", "exact_match", "toy", "reasoning-gym", "reasoning-gym-format")
# The signatures a reward function may be written in (grpojob.rewards.forms): grpojob's own,
# cosmos-rl's and TRL's. The built-in rewards are native.
REWARD_SIGNATURES = ("native", "cosmos", "trl", "cosmos-group", "verl")
BUILTIN_DATASETS = ("toy", "countdown", "reasoning-gym")
BUILTIN_WORKFLOWS = ("single-turn", "greedy-baseline")
# rollout.workflow `none`: the trainer generates nothing itself; its groups come from environments.
NO_WORKFLOW = "none"
BUILTIN_ENGINES = ("vllm", "hf")

KINDS = {
    "algorithm": BUILTIN_ALGORITHMS,
    "reward": BUILTIN_REWARDS,
    "dataset": BUILTIN_DATASETS,
    "dataset_class": (),
    "workflow": (*BUILTIN_WORKFLOWS, NO_WORKFLOW),
    "engine": BUILTIN_ENGINES,
    "trainer": (),
    "loss": (),
    "callback": (),
}

CODE_DIR_ENV = "GRPOJOB_CODE_DIR"  # where relative file references are looked up (see the module doc)
USER_PACKAGE = "grpojob_user"  # the package of the modules loaded from files

# The CRD patterns and the validator share these; a new kind of reference is one more alternative.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_ATTR = rf"{_IDENT}(\.{_IDENT})*"
MODULE_ATTR = rf"{_IDENT}(\.{_IDENT})*:{_ATTR}"
FILE_ATTR = rf"[^:\s]*[^:\s/]\.py:{_ATTR}"
REFERENCE_PATTERNS: tuple[str, ...] = (MODULE_ATTR, FILE_ATTR)
_REF = re.compile("^(" + "|".join(REFERENCE_PATTERNS) + ")$")

# How a process that cannot load user code says so: the trainer's /status `reason`, and the first
# line of a pod's termination message (which the operator reads from the pod's status).
IMPORT_FAILED = "PluginImportFailed"
INSTALL_FAILED = "PluginInstallFailed"
# A process refused to start for a reason a restart cannot change: the trainer refused the spec
# (TrainerError, a dataset that cannot be read, a device that is not there), or an engine's
# package is missing. Like a plug-in that does not import, the job fails with it at once.
START_REFUSED = "StartRefused"
FAILURE_REASONS = (IMPORT_FAILED, INSTALL_FAILED, START_REFUSED)
# A trainer rank that failed once running: restarted (it resumes from its checkpoint), the message
# shown meanwhile; the job fails only once the restarts run out.
TRAINER_FAILED = "TrainerFailed"
# Termination messages that are not the job's failure: a rollout server whose engine broke exits
# non-zero and is restarted (the operator records an Event with the message); a trainer that
# finished says so, in case the operator's poll of /status missed the window.
ENGINE_FAILED = "EngineFailed"
TRAINER_COMPLETED = "Completed"


def name_pattern(kind: str) -> str:
    """The CRD's pattern for a plug-in name of `kind`: a built-in or a well-formed reference (the API
    server refuses anything else; the validator's own message says which names exist)."""
    return "^(" + "|".join((*KINDS[kind], *REFERENCE_PATTERNS)) + ")$"


def is_reference(name: str) -> bool:
    return ":" in name


def is_file_reference(name: str) -> bool:
    return name.rpartition(":")[0].endswith(".py")


def check_name(kind: str, name: str) -> str | None:
    """An error message, or None when `name` is a built-in or a well-formed reference."""
    builtins = KINDS[kind]
    if name in builtins:
        return None
    if not is_reference(name):
        choices = f"one of {', '.join(builtins)} or " if builtins else ""
        return f"unknown {kind.replace('_', ' ')} '{name}': use {choices}'module:attr' or 'path/to/file.py:attr'"
    if not _REF.match(name):
        return f"'{name}' is not a valid 'module:attr' or 'path/to/file.py:attr' reference"
    return None


def checked_name(kind: str, name: str) -> str:
    """`name`, or ValueError (a pydantic field validator's error) saying what is wrong with it."""
    err = check_name(kind, name)
    if err:
        raise ValueError(err)
    return name


def file_path(ref: str) -> Path:
    """The file a `path/to/file.py:attr` reference names, resolved as the module doc says."""
    path = Path(ref.rpartition(":")[0]).expanduser()
    if path.is_absolute():
        return path
    base = os.environ.get(CODE_DIR_ENV)
    if base and (Path(base) / path).exists():
        return Path(base) / path
    return Path.cwd() / path


def _load_file(path: Path):
    """The module of a .py file, loaded once per process (a second reference gets the same classes)."""
    path = path.resolve()
    if not path.is_file():
        raise ImportError(f"no such file '{path}'")
    name = f"{USER_PACKAGE}.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    if USER_PACKAGE not in sys.modules:  # the parent package, so that pickle can import its functions by name
        package = types.ModuleType(USER_PACKAGE)  # (a process pool's workers: AReaL's reward functions)
        package.__path__ = []
        sys.modules[USER_PACKAGE] = package
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def resolve(name: str):
    """Import a reference; ImportError/AttributeError with a message that says what failed."""
    source, _, attr = name.rpartition(":")
    try:
        if is_file_reference(name):
            obj = _load_file(file_path(name))
        else:
            obj = importlib.import_module(source)
    except ImportError as e:
        raise ImportError(f"cannot import {'file' if is_file_reference(name) else 'module'} '{source}': {e}"
                          f"{framework_hint(e)}") from e
    except Exception as e:  # the user's module raised while being imported
        raise ImportError(f"importing '{source}' raised {type(e).__name__}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"'{source}' has no attribute '{attr}'") from None
    return obj


# Frameworks whose code a plug-in may import: each pins torch/transformers below grpojob's, so it is
# installed without its dependencies, and grpojob's extra of the same name brings the light ones it
# imports (docs/plugins.md#frameworks).
FRAMEWORKS = {"cosmos_rl": "cosmos-rl==0.4.7", "verl": "verl==0.9.1", "areal": "areal==1.0.4",
              "art": "openpipe-art==0.5.18"}
FRAMEWORK_EXTRAS = {"cosmos_rl": "cosmos-rl", "verl": "verl", "areal": "areal", "art": "art"}


def framework_hint(e: ImportError) -> str:
    """For a missing framework package: how to install it beside grpojob."""
    top = (getattr(e, "name", None) or "").split(".")[0]
    if top not in FRAMEWORKS:
        return ""
    return (f" (the code imports {FRAMEWORKS[top]}: install it beside grpojob with `pip install "
            f"'grpojob[runtime,{FRAMEWORK_EXTRAS[top]}]'` then `pip install --no-deps {FRAMEWORKS[top]}`; "
            f"docs/plugins.md#frameworks)")


def load_checked(ref: str, where: str, check: Callable[[Any], Optional[str]], error: type[Exception]):
    """resolve(ref), then `check` it (a kind's check: None, or why the object does not fit); a
    failure of either raises `error` naming the field `where`."""
    try:
        obj = resolve(ref)
    except (ImportError, AttributeError) as e:
        raise error(f"{where}: {e}") from None
    why = check(obj)
    if why:
        raise error(f"{where}: '{ref}' {why}")
    return obj


# ---- checking what a reference resolved to ----------------------------------------------------------
# Each kind's check lives next to its registry (most of them import torch); a reference of that
# kind has already imported it when the check runs.
_CHECKS = {
    "trainer": "grpojob.learner.plugin:check_class",
    "loss": "grpojob.learner.cosmos_loss:check_function",
    "engine": "grpojob.rollout.engine:check_class",
    "dataset": "grpojob.data:check_factory",
    "dataset_class": "grpojob.data:check_class",
    "workflow": "grpojob.leader.workflows:check_class",
    "algorithm": "grpojob.algorithms:check_class",
    "reward": "grpojob.rewards:check_function",
    "callback": "grpojob.leader.callbacks:check_class",
}


def check_object(kind: str, obj: Any, *context: Any) -> Optional[str]:
    """Why `obj` cannot serve as a plug-in of `kind`, or None (also None where the check's module
    cannot be imported here, e.g. `grpojob validate` without torch: the process that uses it checks).
    `context`: what the kind's check also reads (a reward: its RewardSpec)."""
    module, _, fn = _CHECKS[kind].partition(":")
    try:
        check = getattr(importlib.import_module(module), fn)
    except ImportError:
        return None
    return check(obj, *context)


def failure_message(reason: str, errors: Iterable[str]) -> str:
    """A termination message: the reason on the first line, then one `spec.field: error` a line."""
    return "\n".join([reason, *errors])


def parse_message(text: str, reasons: Optional[Iterable[str]] = None) -> Optional[tuple[str, str]]:
    """(reason, message) of a termination message written by failure_message whose reason is one
    of `reasons` (any reason when None), else None."""
    head, _, rest = (text or "").strip().partition("\n")
    if head.strip() and (reasons is None or head.strip() in tuple(reasons)) and rest.strip():
        return head.strip(), "; ".join(line.strip() for line in rest.splitlines() if line.strip())
    return None


def parse_failure(text: str) -> Optional[tuple[str, str]]:
    """(reason, message) of a plug-in failure's termination message, else None."""
    return parse_message(text, FAILURE_REASONS)


def parse_engine_failure(text: str) -> Optional[str]:
    """The engine's error in a rollout server's termination message (ENGINE_FAILED), else None."""
    found = parse_message(text, (ENGINE_FAILED,))
    return found[1] if found else None


_COMPLETED_STEP = re.compile(r"^step (\d+)/(\d+)$")


def completion_message(step: int, total: int) -> str:
    """A finished trainer's termination message: TRAINER_COMPLETED, then `step N/TOTAL`."""
    return failure_message(TRAINER_COMPLETED, [f"step {step}/{total}"])


def parse_completion(text: str) -> Optional[int]:
    """The final step of a completion_message, else None."""
    found = parse_message(text, (TRAINER_COMPLETED,))
    m = _COMPLETED_STEP.match(found[1]) if found else None
    return int(m.group(1)) if m else None
