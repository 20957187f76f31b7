"""The GPU placement end to end: an hf rollout server on the trainer's GPU receives pushes over
CUDA IPC and generates what the trainer's model generates; `grpojob run` of the README's example
trains on the GPU. Skipped without CUDA (tests/conftest.py); these pin cuda."""
from __future__ import annotations

import pytest
import torch

from grpojob.local.progress import read_records
from grpojob.sync.publisher import WeightPublisher

from ..local.test_run import grpojob_run, processes_of, workdir  # noqa: F401 - workdir is a fixture
from ..rollout.harness import (PROMPTS, RolloutProcess, free_port, greedy, load_model, make_job, perturb,
                               write_config)

MAX_TOKENS = 12


@pytest.mark.gpu
def test_hf_server_on_the_trainers_gpu_takes_cuda_ipc(tmp_path, tiny_dir, tokenizer):
    # float32: a random tiny model's logits are nearly flat, so bf16 greedy flips between any two
    # implementations' rounding (tests/rollout/test_hf_engine.py); float32 tokens compare exactly
    job = make_job(tiny_dir, model={"dtype": "float32"})  # weightSync.backend auto
    port = free_port()
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="hf-gpu",
                         sync_addr=f"127.0.0.1:{port}", device="cuda").start()
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=port, device="cuda:0", heartbeat_timeout=10,
                          token=srv.token)
    try:
        srv.wait_ready(timeout=180)
        assert pub.servers()[0]["routes"] == ["cuda-ipc"]
        for version, seed in ((1, 11), (2, 12)):
            trainer = perturb(load_model(tiny_dir), seed=seed).to("cuda")  # float32, as the server runs
            stats = pub.push(trainer.state_dict().items(), version=version)
            assert stats["servers"] == 1 and stats["paths"] == {"cuda-ipc": ["hf-gpu"]}
            for text in PROMPTS:
                p = tokenizer.encode(text)
                out = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)
                assert out["policy_version"] == version
                assert out["completions"][0]["completion_ids"] == greedy(trainer, tokenizer, p, MAX_TOKENS)[0]
    finally:
        srv.stop()
        pub.close()


@pytest.mark.gpu
@pytest.mark.slow
def test_grpojob_run_tiny_local_learns_on_the_gpu(workdir):  # noqa: F811 - the fixture
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=60", cwd=workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 61))
    first, last = records[0]["reward_mean"], records[-1]["reward_mean"]
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
    trainer_log = (run_dir / "logs" / "trainer-0.log").read_text()
    assert "via cuda-ipc" in trainer_log and "Duplicate GPU" not in trainer_log
    assert processes_of(run_dir) == []
