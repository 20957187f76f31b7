"""`grpojob run`'s preparation, before any process starts: the manifest validated (every field path at
once), local paths settled, spec.code installed and imported, the tiny models built when asked (through
the per-user cache, grpojob.tiny_cache), the runtime config and the job's token written."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from grpojob import auth
from grpojob.api import FieldError, GRPOJob, InvalidSpec, check, load_manifest
from grpojob.api.data_url import is_url
from grpojob.api.model_file import PYPI, is_gguf, locate
from grpojob.api.plugins import START_REFUSED
from grpojob.api.validate import check_plugins
from grpojob.code import InstallError, install, use_locally
from grpojob.local import image_models, judges
from grpojob.plan import CONFIG_FILE, render_config

SITE_DIR = "site"  # spec.code.pip, installed in the run directory
BUILD_TINY = image_models.BUILD_TINY  # annotation: build a tiny random model if model.path is missing


class RunError(RuntimeError):
    pass


def token_path(run_dir: Path) -> Path:
    """The job's token of a local run (grpojob.auth): what its processes and a client present."""
    return run_dir / auth.TOKEN_KEY


def _resolve_paths(doc: dict[str, Any], run_dir: Path) -> None:
    """Relative model/dataset paths are relative to where `grpojob run` is started (a dataset URL,
    s3:// or hf:// ..., stays as it is); checkpoints always live in the run directory (the
    cluster's absolute mount path means nothing here), unless they go to an object store."""
    spec = doc["spec"]
    image_models.settle(doc)  # the runtime image's models, absent here: built under .cache/image-models
    for section, key in (("model", "path"), ("model", "tokenizer"), ("dataset", "path"), ("code", "localPath")):
        value = (spec.get(section) or {}).get(key)
        if value and not (isinstance(value, str) and (is_url(value) or value.startswith(PYPI))):
            spec[section][key] = str(Path(value).expanduser().resolve())
    held_out = spec.get("evaluation") or {}  # spec.evaluation.dataset.path too
    held_out = held_out.get("dataset") if isinstance(held_out, dict) else None
    if isinstance(held_out, dict) and held_out.get("path") and not is_url(str(held_out["path"])):
        held_out["path"] = str(Path(held_out["path"]).expanduser().resolve())
    judges.resolve_paths(spec)
    ckpt = spec.setdefault("checkpoint", {})
    if not is_url(str(ckpt.get("path", ""))):  # an object store's URL is the same from here
        ckpt["path"] = str(run_dir / str(ckpt.get("path", "checkpoints")).lstrip("/"))


def _convert_gguf(job: GRPOJob, out) -> None:
    """A GGUF spec.model.path (or tokenizer) converted once here, so that every process loads the folder."""
    m = job.spec.model
    for name, value in (("spec.model.path", m.path), ("spec.model.tokenizer", m.tokenizer)):
        if is_gguf(value):
            try:
                locate(value)
            except (FileNotFoundError, ValueError) as e:
                raise InvalidSpec([FieldError(name, str(e))]) from None
    from grpojob import gguf_model

    try:
        gguf_model.resolve(job, echo=lambda line: print(line, file=out))
    except gguf_model.ConversionError as e:
        raise RunError(f"{START_REFUSED}: {e}") from None


def _ensure_model(job: GRPOJob, out) -> None:
    _convert_gguf(job, out)
    path = Path(job.spec.model.path)
    if (path / "config.json").exists():
        return
    annotations = (job.metadata.model_extra or {}).get("annotations") or {}
    flag = str(annotations.get(BUILD_TINY, "")).lower()
    # tools: with tool-call tokens (grpojob.tiny.TOOL_TOKENS); lora: a pretrained model's logit range
    if flag not in ("true", "tools", "lora"):
        raise RunError(f"spec.model.path: '{path}' has no model (config.json); "
                       f"set annotation {BUILD_TINY}: \"true\" to build a tiny random one there")
    from grpojob import tiny_cache
    from grpojob.tiny import LORA_OUTPUT_SCALE, build

    print(f"model {path} not found: building a tiny random model there (annotation {BUILD_TINY})", file=out)
    tiny_cache.build(build, path, tools=flag == "tools", output_scale=LORA_OUTPUT_SCALE if flag == "lora" else 1.0)


def _check_weight_sync(job: GRPOJob) -> None:
    """Refuse, before any process starts, a weightSync.backend that cannot work on this machine."""
    backend = job.spec.weight_sync.backend
    if backend not in ("nccl", "cuda-ipc"):
        return
    from grpojob.sync import placement

    reason = placement.check_local_run(backend, placement.visible_gpus())
    if reason:
        raise InvalidSpec([FieldError(placement.BACKEND_FIELD, reason)])


def _use_code(job: GRPOJob, run_dir: Path, out) -> None:
    """spec.code here: pip requirements into the run directory (what the pods' init container
    does), localPath and that directory on this process's path; then every plug-in must import."""
    c = job.spec.code
    if c.has_modules and not c.local_path:
        print("note: spec.code.configMap/volume are for pods; set spec.code.localPath to the directory "
              "holding those modules for grpojob run", file=out)
    if c.pip:
        try:
            install(job.spec.code, run_dir / SITE_DIR, echo=lambda line: print(line, file=out))
        except InstallError as e:
            raise InvalidSpec([FieldError("spec.code.pip", str(e))]) from None
    use_locally(job, run_dir / SITE_DIR if c.pip else None)
    errors = check_plugins(job)
    if errors:
        raise InvalidSpec(errors)


def prepare(file: str, sets: list[str], run_dir: Optional[str], backend: Optional[str], out) -> tuple[GRPOJob, Path]:
    """Validate the manifest (InvalidSpec with field paths), settle local paths, build the tiny
    model when asked, and write the runtime config into the run directory."""
    doc = load_manifest(file, sets)
    if backend:
        doc.setdefault("spec", {}).setdefault("rollout", {})["backend"] = backend
    name = (doc.get("metadata") or {}).get("name", "grpojob")
    where = Path(run_dir or Path("runs") / str(name)).resolve()
    if isinstance(doc.get("spec"), dict):
        _resolve_paths(doc, where)
    job, errors = check(doc)
    if errors:
        raise InvalidSpec(errors)
    assert job is not None
    _check_weight_sync(job)
    where.mkdir(parents=True, exist_ok=True)
    _use_code(job, where, out)
    _ensure_model(job, out)
    judges.ensure_models(job, out)
    (where / CONFIG_FILE).write_text(render_config(job))
    try:
        auth.ensure_file(token_path(where))
    except auth.TokenError as e:
        raise RunError(f"{e}: delete it and a new token is made") from None
    return job, where
