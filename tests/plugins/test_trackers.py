"""Trackers and callbacks through a real `grpojob run`: TensorBoard scalars read back, a W&B run
written offline (no network), a user callback installed by spec.code.pip into the run dir and
called at every step and checkpoint. MLflow's file store when mlflow is installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpojob.local.progress import read_records

ROOT = Path(__file__).resolve().parents[2]
PKG = Path(__file__).resolve().parent / "callback_pkg"


def manifest(tmp_path: Path, model: Path, monitoring: dict, **spec) -> Path:
    doc = {"apiVersion": "grpojob.io/v1alpha1", "kind": "GRPOJob", "metadata": {"name": "trackers"},
           "spec": {"model": {"path": str(model)}, "dataset": {"factory": "toy", "maxPromptLength": 32},
                    "rewards": [{"name": "toy"}], "algorithm": {"groupSize": 4},
                    "training": {"steps": 3, "promptsPerStep": 4, "learningRate": 0.003, "microBatchTokens": 256},
                    "rollout": {"backend": "hf", "sampling": {"maxTokens": 4}},
                    "checkpoint": {"path": "checkpoints", "everySteps": 2}, "monitoring": monitoring, **spec}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def grpojob_run(path: Path, run_dir: Path, env: dict | None = None) -> str:
    proc = subprocess.run([sys.executable, "-m", "grpojob", "run", str(path), "--run-dir", str(run_dir),
                           "--no-progress"], cwd=path.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


@pytest.mark.slow
def test_tensorboard_wandb_offline_and_a_pip_installed_callback(tmp_path, tiny_dir):
    pytest.importorskip("tensorboard", reason="tensorboard is in the dev extra")
    pytest.importorskip("wandb", reason="wandb is in the dev extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = manifest(tmp_path, tiny_dir, {"reportTo": ["tensorboard", "wandb"],
                                         "callbacks": ["recorder_callback:Recorder"]},
                    code={"pip": [str(PKG)], "pipArgs": ["--no-index", "--no-build-isolation"]})
    run_dir = tmp_path / "run"
    out = grpojob_run(path, run_dir, env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert "spec.code.pip: installing" in out and (run_dir / "site" / "recorder_callback.py").exists()

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    for tag, key in (("reward_mean", "reward_mean"), ("loss", "loss"), ("rewards/toy", None)):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3], tag
        want = [r[key] if key else r["rewards"]["toy"] for r in records]
        assert [e.value for e in events] == pytest.approx(want, rel=1e-6), tag
    assert "stage_seconds/train" in acc.Tags()["scalars"]

    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline W&B run"

    calls = [json.loads(line) for line in (run_dir / "callback.jsonl").read_text().splitlines()]
    steps = [c for c in calls if c["event"] == "step"]
    assert [c["step"] for c in steps] == [1, 2, 3]
    assert [c["loss"] for c in steps] == pytest.approx([r["loss"] for r in records])
    ckpts = [c for c in calls if c["event"] == "checkpoint"]
    assert [c["step"] for c in ckpts] == [2, 3] and all(Path(c["path"]).is_dir() for c in ckpts)


def test_mlflow_file_store(tmp_path, monkeypatch):
    """The MLflow tracker as the loop drives it (the wiring is the test above's): step records in,
    metrics by step and the checkpoint tag out of its default file store."""
    pytest.importorskip("mlflow", reason="mlflow-skinny is in the dev extra; install grpojob[dev] or [trackers]")
    from mlflow.tracking import MlflowClient

    from grpojob.api import parse
    from grpojob.leader.callbacks import Callbacks
    from grpojob.leader.record import StepRecord

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the tracker sets it for its default store
    doc = yaml.safe_load(manifest(tmp_path, tmp_path / "m", {"reportTo": ["mlflow"]}).read_text())
    callbacks = Callbacks.build(parse(doc), tmp_path)
    records = [StepRecord(step=s, policy_version=s, learning_rate=1e-3, reward_mean=0.1 * s, loss=1.0 / s,
                          rewards={"toy": 0.1 * s}, extra={"aux": float(s)}) for s in (1, 2, 3)]
    for r in records:
        callbacks.on_step_end(r)
    callbacks.on_checkpoint(3, tmp_path / "checkpoints" / "step-000003")
    callbacks.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("grpojob").experiment_id])
    for key, want in (("reward_mean", [0.1, 0.2, 0.3]), ("rewards/toy", [0.1, 0.2, 0.3]), ("extra/aux", [1, 2, 3])):
        history = client.get_metric_history(run.info.run_id, key)
        assert [(m.step, m.value) for m in history] == [(s, pytest.approx(v)) for s, v in zip((1, 2, 3), want)], key
    assert run.data.tags["last_checkpoint"].endswith("step-000003") and run.info.status == "FINISHED"


def test_evaluations_reach_tensorboard_mlflow_and_callbacks_at_the_step_they_evaluated(tmp_path, monkeypatch):
    """spec.evaluation: each evaluation is reported (on_evaluation) after its step's record and before
    the next one's; its numbers are eval/... scalars at the step whose policy it measured."""
    pytest.importorskip("tensorboard", reason="tensorboard is in the dev extra")
    pytest.importorskip("mlflow", reason="mlflow-skinny is in the dev extra")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from grpojob.api import parse
    from grpojob.leader.evaluation import EvalRecord
    from grpojob.leader.callbacks import Callback, Callbacks
    from grpojob.leader.record import StepRecord

    class Seen(Callback):
        calls: list = []

        def on_evaluation(self, record):
            self.calls.append(record.step)

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    doc = yaml.safe_load(manifest(tmp_path, tmp_path / "m", {"reportTo": ["tensorboard", "mlflow"]}).read_text())
    callbacks = Callbacks.build(parse(doc), tmp_path)
    callbacks.items.append(("test", Seen()))
    for s in (1, 2, 3):
        callbacks.on_step_end(StepRecord(step=s, policy_version=s, learning_rate=1e-3, reward_mean=0.1 * s))
        if s >= 2:
            callbacks.on_evaluation(EvalRecord(step=s, policy_version=s, prompts=4, samples_per_prompt=4, greedy=False,
                                               pass_threshold=1.0, reward_mean=0.2 * s, rewards={"toy": 0.2 * s},
                                               pass_at={"1": 0.1 * s, "4": 0.3 * s}))
    callbacks.close()
    assert Seen.calls == [2, 3]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    for tag, want in (("eval/reward_mean", [0.4, 0.6]), ("eval/rewards/toy", [0.4, 0.6]),
                      ("eval/pass_at_4", [0.6, 0.9])):
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == [(s, pytest.approx(v)) for s, v in zip((2, 3), want)]
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("grpojob").experiment_id])
    history = client.get_metric_history(run.info.run_id, "eval/pass_at_1")
    assert [(m.step, m.value) for m in history] == [(2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
