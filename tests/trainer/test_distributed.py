"""Data parallelism: 2 gloo ranks under torchrun end with the parameters of 1 rank trained on the
same global batch (packing, loss normalisation and the gradient all-reduce are global). The FSDP2
case also resumes from the 1-rank run's step-2 checkpoint (another world size and wrapper)."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpojob.plan import CONFIG_FILE, ENV_CHECKPOINT_DIR, ENV_CONFIG, ENV_RUN_DIR, render_config
from grpojob.trainer.build import build

from .conftest import make_job
from .procs import ROOT, free_port

OVER = dict(training={"steps": 3, "promptsPerStep": 8, "microBatchTokens": 128},
            algorithm={"name": "grpo", "groupSize": 4, "lossAggregation": "seq-mean-token-mean"},
            checkpoint={"everySteps": 2, "keepLast": 5})


@pytest.fixture(scope="module")
def one_rank(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run = build(make_job(tiny_dir, **OVER), checkpoint_dir=str(out / "ck"), run_dir=str(out))
    before = {k: v.clone() for k, v in run.trainer.model.state_dict().items()}
    run.run()
    return before, load_file(str(out / "final-model" / "model.safetensors")), out / "ck" / "step-000002"


def _torchrun(procs, job, tmp: Path, nproc: int) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / CONFIG_FILE).write_text(render_config(job))
    env = {**os.environ, ENV_CONFIG: str(tmp / CONFIG_FILE), ENV_RUN_DIR: str(tmp),
           ENV_CHECKPOINT_DIR: str(tmp / "ck"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", "tests.trainer.dist_worker"]
    proc = procs(cmd, env, tmp / "torchrun.log")
    assert proc.wait(600) == 0, proc.tail(8000)
    return load_file(str(tmp / "final-model" / "model.safetensors")), proc.log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_ranks_match_one_rank(tiny_dir, tmp_path, one_rank, strategy, procs):
    before, single, step2 = one_rank
    job = make_job(tiny_dir, **{**OVER, "trainer": {"processesPerReplica": 2},
                               "training": {**OVER["training"], "strategy": strategy}})
    resume = strategy == "fsdp"
    if resume:
        shutil.copytree(step2, tmp_path / "ck" / step2.name)
    double, out = _torchrun(procs, job, tmp_path, 2)
    assert f"rank 1/2 strategy {strategy}" in out
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == ([3] if resume else [1, 2, 3])
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
