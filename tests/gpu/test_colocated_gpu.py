"""spec.placement colocated on one GPU: the engine takes turns with the trainer and its pushes go
over CUDA IPC, straight into the engine's parameters. Skipped without CUDA (tests/conftest.py);
these pin cuda. The vLLM test also needs the `vllm` extra (a GPU build of vLLM)."""
from __future__ import annotations

import asyncio
import os

import pytest
import torch

from grpojob.local.progress import read_records
from grpojob.contracts.rollout import SamplingParams
from grpojob.sync.publisher import WeightPublisher
from grpojob.leader.turns import EngineTurns

from ..local.test_run import grpojob_run, processes_of, workdir  # noqa: F401 - workdir is a fixture
from ..rollout.harness import (PROMPTS, RolloutProcess, free_port, greedy, load_model, make_job, perturb,
                               write_config)

MAX_TOKENS = 12


def _colocated(tiny_dir, **over):
    return make_job(tiny_dir, placement="colocated", trainer={"replicas": 1}, rollout={"replicas": 1}, **over)


def _colocated_float32(tiny_dir):
    """float32: a random tiny model's logits are nearly flat, so bf16 greedy flips between any two
    implementations' rounding (tests/rollout/test_hf_engine.py); float32 tokens compare exactly."""
    return _colocated(tiny_dir, model={"dtype": "float32"})


@pytest.mark.gpu
def test_colocated_engine_sleeps_wakes_and_takes_cuda_ipc_pushes_in_place(tmp_path, tiny_dir, tokenizer):
    job = _colocated_float32(tiny_dir)  # weightSync.backend auto
    port = free_port()
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="colocated",
                         sync_addr=f"127.0.0.1:{port}", device="cuda").start()
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=port, device="cuda:0", heartbeat_timeout=10,
                          token=srv.token, colocated=True)
    turns = EngineTurns(lambda: [srv.url], srv.token, device=torch.device("cuda:0"), timeout=60)
    try:
        srv.wait_ready(timeout=180)
        assert pub.servers()[0]["routes"] == ["cuda-ipc"]
        for version, seed in ((1, 11), (2, 12)):
            slept = turns.sleep()
            assert slept["freed_bytes"] > 0 and "device_used_bytes" in slept
            woke = turns.wake()
            assert woke["decode_steps"] == slept["decode_steps"]  # nothing decoded while asleep
            trainer = perturb(load_model(tiny_dir), seed=seed).to("cuda")  # float32, as the engine runs
            stats = pub.push(trainer.state_dict().items(), version=version)
            assert stats["paths"] == {"cuda-ipc": ["colocated"]}
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
def test_grpojob_run_colocated_learns_on_the_gpu_over_cuda_ipc(workdir):  # noqa: F811 - the fixture
    run_dir = workdir / "run"
    proc = grpojob_run(run_dir, "training.steps=60", "placement=colocated", cwd=workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    records = read_records(run_dir / "metrics.jsonl")
    first, last = records[0]["reward_mean"], max(r["reward_mean"] for r in records[-3:])
    assert last >= first + 0.5, f"reward {first:.3f} -> {last:.3f}"
    assert {r["weight_sync_backend"] for r in records} == {"cuda-ipc"}
    for r in records:
        assert r["turns"]["sleep"]["decode_steps"] == r["turns"]["wake"]["decode_steps"]
        assert {"generate", "train", "sync"} <= set(r["stage_device_peak_bytes"])
        assert r["turns"]["sleep"]["device_used_bytes"] > 0
    assert processes_of(run_dir) == []


@pytest.mark.gpu
def test_vllm_sleeps_at_level_1_and_wakes_to_the_same_output(tiny_dir, tokenizer):
    pytest.importorskip("vllm")
    from grpojob.rollout.vllm_engine import VLLMEngine

    job = _colocated(tiny_dir, rollout={"replicas": 1, "backend": "vllm", "gpuMemoryUtilization": 0.3,
                                        "enforceEager": True})

    async def main():
        engine = VLLMEngine(job.spec)
        await engine.start()
        try:
            greedy_ = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
            ids = tokenizer.encode(PROMPTS[0])
            (before,) = await engine.generate(ids, 1, greedy_)
            free_awake, _ = torch.cuda.mem_get_info(0)
            slept = await engine.sleep(1)
            free_asleep, _ = torch.cuda.mem_get_info(0)
            assert slept["slept"] and free_asleep > free_awake + 2**30  # the KV cache went back to the device
            pending = asyncio.ensure_future(engine.generate(ids, 1, greedy_))
            await asyncio.sleep(0.5)
            assert not pending.done()  # waits for the wake
            await engine.wake()
            (after,) = await asyncio.wait_for(pending, 120)
            assert after.completion_ids == before.completion_ids  # level 1 kept the weights
        finally:
            await engine.close()

    asyncio.run(main())


@pytest.mark.gpu
@pytest.mark.slow
def test_the_one_container_of_a_colocated_gpu_pod_trains_over_cuda_ipc(tmp_path, tiny_dir):
    """`grpojob colocated-pod`, what a colocated trainer pod with GPUs runs (one container, since a
    device plugin gives the GPU to one container): its trainer and engine share the GPU, the pushes
    go over CUDA IPC, and the pod's SIGTERM stops both."""
    import signal

    from ..local.test_colocated_pod import container, no_process_left
    from ..helpers.trainer_status import wait_completed

    proc, port, token = container(tmp_path, tiny_dir, None,
                                  training={"steps": 3, "promptsPerStep": 4, "microBatchTokens": 512})
    try:
        done = wait_completed(port, token, [proc], [tmp_path / "log"], timeout=600)
        assert done["step"] == 3 and done["weightSyncBackend"] == "cuda-ipc"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(120)  # with torchrun's code for a SIGTERM, as a trainer container of its own
    assert "colocated pod: signal 15" in (tmp_path / "log").read_text()
    no_process_left(tmp_path)
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    assert [r["weight_sync_backend"] for r in records] == ["cuda-ipc"] * 3
