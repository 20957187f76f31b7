"""Trackers and callbacks through a real `grpojob run`: TensorBoard scalars read back, a W&B run
written offline (no network), a user callback installed by spec.code.pip into the run dir and
called at every step and checkpoint. MLflow's file store when mlflow is installed."""
from __future__ import annotations

import json
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
    import os

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


@pytest.mark.slow
def test_mlflow_file_store(tmp_path, tiny_dir):
    pytest.importorskip("mlflow", reason="mlflow is not in the dev extra (a heavy install): "
                        "pip install 'grpojob[trackers]' to run this test")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    grpojob_run(manifest(tmp_path, tiny_dir, {"reportTo": ["mlflow"]}), run_dir)
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("grpojob").experiment_id])
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    records = read_records(run_dir / "metrics.jsonl")
    assert [(m.step, m.value) for m in history] == [(r["step"], pytest.approx(r["reward_mean"])) for r in records]
    assert run.data.tags["last_checkpoint"].endswith("step-000003")
