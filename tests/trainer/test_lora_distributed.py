"""LoRA under data parallelism: 2 gloo ranks (DDP, FSDP2) train the same adapter as 1 rank on the
same global batch (with a KL to the adapter-off base); only the adapter is trainable and saved
(final-model/ is a PEFT adapter)."""
import os
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grpojob.plan import CONFIG_FILE, ENV_CHECKPOINT_DIR, ENV_CONFIG, ENV_RUN_DIR, render_config
from grpojob.sync import adapter as adapter_fmt
from grpojob.leader.build import build

from .conftest import make_job
from .procs import ROOT, free_port

OVER = dict(model={"lora": {"rank": 4, "alpha": 8}},
            training={"steps": 3, "promptsPerStep": 8, "microBatchTokens": 128, "learningRate": 1e-2},
            algorithm={"name": "grpo", "groupSize": 4, "lossAggregation": "seq-mean-token-mean", "klBeta": 0.01},
            checkpoint={"everySteps": 100})


def _job(model_dir, **more):
    over = {**OVER, **more}
    over["model"] = {"path": str(model_dir), **OVER["model"]}
    return make_job(model_dir, **over)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_ranks_train_the_adapter_one_rank_trains(tiny_sharp_dir, tmp_path, strategy, procs):
    one = tmp_path / "one"
    run = build(_job(tiny_sharp_dir), checkpoint_dir=str(one / "ck"), run_dir=str(one))
    run.run()
    single = load_file(str(one / "final-model" / adapter_fmt.WEIGHTS))
    assert (one / "final-model" / adapter_fmt.CONFIG).is_file() and all(".lora_" in k for k in single)

    two = tmp_path / "two"
    two.mkdir()
    job = _job(tiny_sharp_dir, trainer={"processesPerReplica": 2},
               training={**OVER["training"], "strategy": strategy})
    (two / CONFIG_FILE).write_text(render_config(job))
    env = {**os.environ, ENV_CONFIG: str(two / CONFIG_FILE), ENV_RUN_DIR: str(two),
           ENV_CHECKPOINT_DIR: str(two / "ck"), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "tests.trainer.dist_worker"]
    proc = procs(cmd, env, two / "torchrun.log")
    assert proc.wait(600) == 0, proc.tail(8000)
    assert f"rank 1/2 strategy {strategy}" in proc.log.read_text()
    double = load_file(str(Path(two) / "final-model" / adapter_fmt.WEIGHTS))
    assert single.keys() == double.keys()
    assert max(single[k].abs().max().item() for k in single if "lora_B" in k) > 1e-3  # B starts at 0: it moved
    for k in single:
        assert (double[k] - single[k]).abs().max().item() < 1e-3, k
