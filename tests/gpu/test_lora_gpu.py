"""LoRA on vLLM on a GPU: the trainer's adapter (trained on cuda) reaches a vllm rollout server on
the same GPU (CUDA IPC) or another (NCCL), vLLM serves it as a LoRARequest per version, and greedy
tokens match PEFT's model (base + the same adapter) on the GPU. Skipped without CUDA
(tests/conftest.py pins cuda for gpu-marked tests); needs vllm."""
from __future__ import annotations

import pytest
import torch

from grpojob.sync import adapter as adapter_fmt
from grpojob.sync.publisher import WeightPublisher
from grpojob.learner.trainer import GRPOTrainer

from ..rollout.harness import RolloutProcess, free_port, make_job, wait_for, write_config

PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 300, 12, 9]]
MAX_TOKENS = 8


def peft_greedy(model_dir, adapter_dir, prompt):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda")
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.gpu
@pytest.mark.vllm
def test_vllm_on_gpu_serves_each_pushed_adapter(tmp_path, tiny_sharp_dir):
    pytest.importorskip("vllm")
    # float32 on both sides: greedy tokens compare exactly
    job = make_job(tiny_sharp_dir, model={"path": str(tiny_sharp_dir), "dtype": "float32",
                                          "lora": {"rank": 8, "alpha": 16}},
                   rollout={"backend": "vllm", "maxModelLen": 256, "gpuMemoryUtilization": 0.3,
                            "enforceEager": True})
    tr = GRPOTrainer(job)
    assert tr.env.device.type == "cuda"
    port = free_port()
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="vllm-gpu",
                         backend="vllm", sync_addr=f"127.0.0.1:{port}", device="cuda").start()
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=port, device="cuda:0",
                          heartbeat_timeout=10, token=srv.token)
    try:
        wait_for(lambda: srv.status("/info")[1].get("engine") in ("up", "failed"), 300, "vLLM start-up",
                 interval=0.5, proc=srv.proc)
        srv.wait_ready(timeout=120)
        for version in (1, 2):
            with torch.no_grad():
                for p in tr.model.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn_like(p) * 0.3)
            stats = pub.push(tr.weight_stream(torch.float32), version=version)
            assert stats["adapter"] and stats["servers"] == 1 and stats["dropped"] == []
            assert set(stats["paths"]) <= {"cuda-ipc", "nccl"}
            ref = tmp_path / f"ref-v{version}"
            adapter_fmt.save(ref, tr.weight_stream())
            for p in PROMPTS:
                c = srv.generate(p, temperature=0, max_tokens=MAX_TOKENS)["completions"][0]
                assert c["policy_version"] == version
                assert c["completion_ids"] == peft_greedy(tiny_sharp_dir, ref, p)[:len(c["completion_ids"])]
    finally:
        srv.stop()
        pub.close()
