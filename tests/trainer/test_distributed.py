"""Data parallelism: 2 gloo ranks under torchrun end with the parameters of 1 rank trained on the
same global batch (packing, loss normalisation and the gradient all-reduce are global).
Checkpoints change world size on resume (torch.distributed.checkpoint reshards): 1 -> 2 ranks
(FSDP2) and 2 (DDP) -> 1 take their next step exactly as the uninterrupted run did; 2 (FSDP2) -> 1
loads the sharded weights whole."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpojob.plan import CONFIG_FILE, ENV_CHECKPOINT_DIR, ENV_CONFIG, ENV_RUN_DIR, render_config
from grpojob.leader.build import build

from .conftest import make_job
from .procs import ROOT, free_port

OVER = dict(training={"steps": 3, "promptsPerStep": 8, "microBatchTokens": 128},
            algorithm={"name": "grpo", "groupSize": 4, "lossAggregation": "seq-mean-token-mean"},
            checkpoint={"everySteps": 1, "keepLast": 5})
# What a step computes from the weights and optimizer state it starts from, and its samples.
STEP_FIGURES = ("loss", "grad_norm", "entropy", "reward_mean", "importance_weight_mean")


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _same_step(a: dict, b: dict) -> None:
    assert a["sample_ids"] == b["sample_ids"]
    for k in STEP_FIGURES:
        assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), f"step {a['step']} {k}: {a[k]} != {b[k]}"


@pytest.fixture(scope="module")
def one_rank(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run = build(make_job(tiny_dir, **OVER), checkpoint_dir=str(out / "ck"), run_dir=str(out))
    before = {k: v.clone() for k, v in run.trainer.model.state_dict().items()}
    run.run()
    return before, load_file(str(out / "final-model" / "model.safetensors")), out


def _torchrun(procs, job, tmp: Path, nproc: int) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / CONFIG_FILE).write_text(render_config(job))
    env = {**os.environ, ENV_CONFIG: str(tmp / CONFIG_FILE), ENV_RUN_DIR: str(tmp),
           ENV_CHECKPOINT_DIR: str(tmp / "ck"), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "tests.trainer.dist_worker"]
    proc = procs(cmd, env, tmp / "torchrun.log")
    assert proc.wait(600) == 0, proc.tail(8000)
    return load_file(str(tmp / "final-model" / "model.safetensors")), proc.log.read_text()


def _resume_on_one_rank(tiny_dir, checkpoint: Path, tmp: Path):
    """A lone trainer resuming from a copy of `checkpoint`, to the end of the run."""
    shutil.copytree(checkpoint, tmp / "ck" / checkpoint.name)
    run = build(make_job(tiny_dir, **OVER), checkpoint_dir=str(tmp / "ck"), run_dir=str(tmp))
    assert run.resumed_from is not None and run.resumed_from.name == checkpoint.name
    return run


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_ranks_match_one_rank(tiny_dir, tmp_path, one_rank, strategy, procs):
    before, single, one_dir = one_rank
    job = make_job(tiny_dir, **{**OVER, "trainer": {"processesPerReplica": 2},
                               "training": {**OVER["training"], "strategy": strategy}})
    resume = strategy == "fsdp"  # 1 -> 2 ranks: the one-rank run's step-2 checkpoint
    if resume:
        shutil.copytree(one_dir / "ck" / "step-000002", tmp_path / "ck" / "step-000002")
    double, out = _torchrun(procs, job, tmp_path, 2)
    assert f"rank 1/2 strategy {strategy}" in out
    records = _records(tmp_path)
    assert sorted(records) == ([3] if resume else [1, 2, 3])
    if resume:  # the resumed step is the uninterrupted one, now on two ranks
        _same_step(records[3], _records(one_dir)[3])
    assert single.keys() == double.keys()
    moved = max((single[k] - before[k]).abs().max().item() for k in single)
    assert moved > 1e-3, "the step changed nothing: the comparison would be vacuous"
    for k in single:
        # Float summation order differs (other packing, the all-reduce); Adam turns that into
        # differences up to ~1e-5 after 3 steps, rarely ~1e-4 for a weight whose gradient is
        # near 0 (Adam divides by its tiny second moment). A real error (e.g. a loss not scaled
        # for the gradient average) moves many weights by ~lr/10 = 3e-4.
        diff = (double[k] - single[k]).abs()
        far = (diff > 1e-4 + 1e-4 * single[k].abs()).float().mean().item()
        assert far <= 1e-3 and diff.max().item() < 1e-3, f"{k}: {far:.2%} of weights differ, up to {diff.max():.2e}"

    # 2 -> 1 rank
    if strategy == "ddp":  # its step-2 checkpoint: step 3 again on one rank, as the two ranks took it
        alone = _resume_on_one_rank(tiny_dir, tmp_path / "ck" / "step-000002", tmp_path / "alone")
        assert alone.trainer.step == 2 and alone.run() == "completed"
        _same_step(_records(tmp_path / "alone")[3], records[3])
    else:  # its final checkpoint (FSDP2 shards): the weights whole again
        alone = _resume_on_one_rank(tiny_dir, tmp_path / "ck" / "step-000003", tmp_path / "alone")
        assert alone.trainer.step == 3 and alone.trainer.strategy == "none"
        loaded = alone.trainer.model.state_dict()
        for k in double:
            assert torch.equal(loaded[k], double[k]), k
        alone.rollouts.close()
