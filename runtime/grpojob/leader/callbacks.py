"""Experiment trackers and user callbacks: what the trainer leader tells them, and when.

`Callbacks` is the loop's one component for them (spec.monitoring.reportTo and .callbacks), called
on rank 0 only: `on_step_end(record)` after each step's record is written, `on_evaluation(record)`
after each evaluation (spec.evaluation; logged at the step it evaluated, before the next step's
record), `on_checkpoint(step, path)` after each checkpoint, `close()` when the run ends. A
callback that raises is logged with its field path and kept (a tracker's hiccup must not lose a
training run).

A user callback (`module:Class` or `path/to/file.py:Class`, constructed without arguments)
subclasses `Callback` or has the same two methods; `on_evaluation` and `close` are optional.
"""
from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpojob.api import GRPOJob, plugins
from grpojob.contracts.protocols import Callback

log = logging.getLogger("grpojob.trainer")

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
MLRUNS_DIR = "mlruns"


def check_class(cls) -> Optional[str]:
    if not inspect.isclass(cls):
        return "is not a class (a callback class with on_step_end and on_checkpoint is expected)"
    missing = [m for m in ("on_step_end", "on_checkpoint") if not callable(getattr(cls, m, None))]
    if missing:
        return f"lacks {' and '.join(missing)} (subclass grpojob.Callback)"
    return None


# ---- trackers -------------------------------------------------------------------------------------
# The package each spec.monitoring.reportTo value imports (the `trackers` extra provides them all;
# the runtime image installs it: tests/chart/test_images.py checks both against this table).
TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def _need(tracker: str):
    module = TRACKER_MODULES[tracker]
    try:
        return __import__(module)
    except ImportError:
        raise RuntimeError(f"spec.monitoring.reportTo: {tracker} needs the '{module}' package "
                           f"(pip install 'grpojob[trackers]')") from None


@dataclass(frozen=True)
class RunInfo:
    """What a tracker takes of a job: the run's name, its spec as plain data, the run directory."""
    name: str
    config: dict[str, Any]
    run_dir: Path


class TensorBoard(Callback):
    """Scalars as TensorBoard event files in <run dir>/tensorboard."""

    def __init__(self, run: RunInfo):
        _need("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run.run_dir / TENSORBOARD_DIR), flush_secs=10)

    def on_step_end(self, record) -> None:
        for name, value in record.scalars().items():
            self.writer.add_scalar(name, value, record.step, walltime=record.time)
        self.writer.flush()

    on_evaluation = on_step_end  # eval/... scalars at the step evaluated

    def close(self) -> None:
        self.writer.close()


class WandB(Callback):
    """A W&B run named after the job. Offline (files in <run dir>/wandb, `wandb sync` later) unless
    WANDB_MODE says otherwise or WANDB_API_KEY is set; WANDB_PROJECT, WANDB_ENTITY... apply."""

    def __init__(self, run: RunInfo):
        wandb = _need("wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        (run.run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "grpojob"), name=run.name,
                              dir=str(run.run_dir), mode=mode, config=run.config, reinit="create_new")

    def on_step_end(self, record) -> None:
        self.run.log(record.scalars(), step=record.step)

    # W&B takes a step once more while it is the current one: an evaluation is reported after its
    # step's record and before the next one's.
    on_evaluation = on_step_end

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.run.summary["last_checkpoint"] = str(path)

    def close(self) -> None:
        self.run.finish()


class MLflow(Callback):
    """An MLflow run named after the job: MLFLOW_TRACKING_URI, default a file store in <run dir>/mlruns
    (no server, no database; MLflow 3 wants MLFLOW_ALLOW_FILE_STORE for it, set here for that default)."""

    def __init__(self, run: RunInfo):
        self.mlflow = _need("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run.run_dir / MLRUNS_DIR).resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = self.mlflow.tracking.MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "grpojob")
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(name)
        self.run_id = self.client.create_run(exp_id, run_name=run.name).info.run_id

    def on_step_end(self, record) -> None:
        from mlflow.entities import Metric

        ms = int(record.time * 1000)
        metrics = [Metric(_mlflow_key(k), v, ms, record.step) for k, v in record.scalars().items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    on_evaluation = on_step_end

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.client.set_tag(self.run_id, "last_checkpoint", str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


TRACKERS = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Callbacks:
    """The trackers and callbacks of one run, each called in turn (rank 0 builds them)."""

    def __init__(self, items: list[tuple[str, Any]]):
        self.items = items  # (field path, callback)

    @classmethod
    def build(cls, job: GRPOJob, run_dir: Optional[Path]) -> "Callbacks":
        """The process's one reading of the job for its callbacks: trackers get a RunInfo."""
        m = job.spec.monitoring
        items: list[tuple[str, Any]] = []
        if m.report_to and run_dir is None:
            raise RuntimeError("spec.monitoring.reportTo needs a run directory (GRPOJOB_RUN_DIR)")
        if m.report_to:
            run = RunInfo(name=job.metadata.name, config=job.spec.dump(), run_dir=run_dir)
        for i, name in enumerate(m.report_to):
            items.append((f"spec.monitoring.reportTo[{i}]", TRACKERS[name](run)))
        for i, ref in enumerate(m.callbacks):
            where = f"spec.monitoring.callbacks[{i}]"
            items.append((where, plugins.load_checked(ref, where, check_class, RuntimeError)()))
        return cls(items)

    def _each(self, method: str, *args) -> None:
        for where, cb in self.items:
            fn = getattr(cb, method, None)
            if fn is None:  # on_evaluation() and close() are optional for duck-typed callbacks
                continue
            try:
                fn(*args)
            except Exception:
                log.exception("%s: %s.%s failed (the run goes on)", where, type(cb).__name__, method)

    def on_step_end(self, record) -> None:
        self._each("on_step_end", record)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._each("on_checkpoint", step, path)

    def on_evaluation(self, record) -> None:
        self._each("on_evaluation", record)

    def close(self) -> None:
        self._each("close")
