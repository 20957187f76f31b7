"""The train stage sized for its device (learner.sizing, flops, kernels): the GPU-only rules
(micro-batch tokens from free memory, output-layer tiles by device memory, MFU against the GPU's
peak, liger's kernels or not) tested on the CPU through the same pure functions they run."""
from __future__ import annotations

import logging

import pytest
import torch

from grpojob.leader.build import build
from grpojob.learner import flops, kernels, sizing
from grpojob.learner.logprobs import TILE_ELEMENTS
from grpojob.learner.packing import TrainSeq

from .conftest import make_job

GIB = 2 ** 30


def test_activation_bytes_per_token_counts_each_layer_width():
    # per layer: 2 bytes x (5 x 64 + 2 x 32 + 4 x 128) + 4 x 4 x 64 = 2,816; 2 layers; x SAFETY 1.25
    assert sizing.activation_bytes_per_token(64, 128, 32, 2) == int(2 * 2816 * 1.25) == 7040


def test_memory_cap_is_the_largest_power_of_two_that_fits_with_margin():
    # 0.6 x 1,000,000 - 100,000 = 500,000 usable bytes / 100 per token = 5,000 tokens -> 4,096
    assert sizing.memory_cap(1_000_000, 100, 100_000, floor=16, share=0.6) == 4096
    # nothing left over the fixed part: the spec's floor (a sequence must still fit)
    assert sizing.memory_cap(100_000, 100, 100_000, floor=256, share=0.6) == 256
    # a huge device: the ceiling
    assert sizing.memory_cap(10 ** 13, 100, 0, floor=16, ceiling=65_536) == 65_536
    # a floor above what fits wins (today's behaviour: the spec's value)
    assert sizing.memory_cap(1_000_000, 100, 0, floor=8192, share=0.6) == 8192


def test_step_budget_trades_padding_against_micro_batches():
    # 37,000 tokens (the 0.5B benchmark's step), per micro-batch cost 4,096 tokens, the last
    # micro-batch's width rounded up to a flex tile of 128 (the layers compile for dynamic widths):
    #   4,096: 9 full + 136 -> 256: 37,120 + 10 x 4,096 = 78,080
    #   8,192: 4 full + 4,232 -> 4,352: 37,120 + 5 x 4,096 = 57,600
    #  32,768: 1 full + 4,232 -> 4,352: 37,120 + 2 x 4,096 = 45,312
    #  65,536: 0 full + 37,000 -> 37,120: 37,120 + 4,096 = 41,216   <- least (powers of two: 77% padding)
    assert sizing.step_budget(37_000, 4096, 65_536) == 65_536
    assert sizing.step_budget(37_000, 4096, 16_384) == 16_384  # the memory cap bounds it
    assert sizing.step_budget(37_000, 4096, 4096) == 4096
    # padding is at most a tile, so the per-micro-batch cost decides: the fewest micro-batches
    assert sizing.step_budget(8_576, 4096, 32_768) == 32_768


def test_bucketed_widths_are_multiples_of_a_flex_tile_not_powers_of_two():
    """CUDA packing (bucket=True): a step of 128 completions of 64 tokens after prompts of 24 goes
    in one micro-batch whose width is its tokens rounded up to 128, not the next power of two
    (16,384: about half of it padding)."""
    from grpojob.learner.packing import pack

    mbs = pack([_seq(24, 64) for _ in range(128)], 32_768, row_tokens=32_768, bucket=True)
    assert len(mbs) == 1
    (rows, width), tokens = mbs[0].shape, mbs[0].n_tokens
    assert rows == 1 and width % 128 == 0 and tokens <= width < tokens + 128 and width < 16_384


def _seq(prompt: int, completion: int) -> TrainSeq:
    return TrainSeq(prompt_ids=[1] * prompt, completion_ids=[2] * completion, loss_mask=[1] * completion,
                    rollout_logprobs=[0.0] * completion, advantage=1.0)


def test_budget_is_the_spec_value_unless_auto_and_measures_once():
    def never() -> int:
        raise AssertionError("a fixed budget measures nothing")

    assert sizing.Budget(4096, auto=False, measure=never).for_step([_seq(100, 900)] * 37) == 4096
    calls = []
    budget = sizing.Budget(4096, auto=True, measure=lambda: calls.append(1) or 65_536)
    seqs = [_seq(100, 900)] * 37  # 37,000 tokens
    assert budget.for_step(seqs) == 65_536 and budget.for_step(seqs) == 65_536  # one micro-batch, 37,120 wide
    assert calls == [1] and budget.cap == 65_536


def test_output_layer_tiles_grow_on_a_big_gpu_and_in_host_memory():
    assert sizing.head_tile(None) == 2 * TILE_ELEMENTS  # CPU
    assert sizing.head_tile(24 * GIB) == TILE_ELEMENTS
    assert sizing.head_tile(80 * GIB) == sizing.head_tile(141 * GIB) == 8 * TILE_ELEMENTS


def test_flops_of_a_sequence_are_six_per_weight_plus_causal_attention():
    f = flops.ModelFlops(matmul_params=1000, layers=2, attention_width=8)
    # 2 trained tokens at positions 3 and 4 attend to 4 + 5 = 9 positions:
    # 6 x 1000 x 2 + 12 x 2 layers x 8 x 9 = 12,000 + 1,728
    assert f.sequence(3, 2) == 13_728
    assert f.total([(3, 2), (0, 1)]) == 13_728 + 6000 + 12 * 2 * 8 * 1


@pytest.mark.parametrize("tied", [False, True])
def test_model_flops_leave_out_the_input_embedding_unless_tied(tied):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(cfg)
    unique = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    f = flops.model_flops(model)
    assert f.layers == 2 and f.attention_width == 16
    assert f.matmul_params == (unique if tied else unique - 100 * 16)


def test_peak_by_gpu_name_and_none_on_a_cpu():
    assert flops.peak_bf16("NVIDIA H100 80GB HBM3") == flops.peak_bf16("NVIDIA H200") == 989e12
    assert flops.peak_bf16("NVIDIA H100 PCIe") == 756e12
    assert flops.peak_bf16("NVIDIA A100-SXM4-80GB") == 312e12
    assert flops.peak_bf16("NVIDIA GeForce RTX 4090") is None
    assert flops.device_peak(torch.device("cpu")) is None


def test_liger_decision():
    assert kernels.decide("cuda", None, True, "qwen2")[0]
    assert kernels.decide("cuda", "1", True, "qwen2")[0]
    off = [("cuda", "0", True, "qwen2"), ("cpu", None, True, "qwen2"), ("cpu", "1", True, "qwen2"),
           ("cuda", None, False, "qwen2"), ("cuda", "1", False, "qwen2"), ("cuda", None, True, "gpt2"),
           ("cuda", "yes", True, "qwen2")]
    for args in off:
        use, why = kernels.decide(*args)
        assert not use and why, args
    assert "not installed" in kernels.decide("cuda", "1", False, "qwen2")[1]


def test_liger_absent_or_failing_leaves_the_model_as_it_was(tiny_dir, monkeypatch, caplog):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    forwards = {n: m.forward for n, m in model.named_modules()}
    monkeypatch.delenv(kernels.ENV, raising=False)
    monkeypatch.setattr(kernels, "installed", lambda: False)
    assert kernels.apply(model, torch.device("cuda")) is False  # decided before touching the device
    monkeypatch.setattr(kernels, "installed", lambda: True)
    assert kernels.apply(model, torch.device("cpu")) is False

    def broken(device):
        raise RuntimeError("no Triton for this GPU")

    monkeypatch.setattr(kernels, "_probe", broken)
    with caplog.at_level(logging.WARNING, logger="grpojob.trainer"):
        assert kernels.apply(model, torch.device("cuda")) is False
    assert "no Triton for this GPU" in caplog.text and "model's own layers" in caplog.text
    assert {n: m.forward for n, m in model.named_modules()} == forwards


def test_cpu_step_record_has_train_flops_and_no_mfu(tiny_dir, tmp_path):
    """On the CPU: the spec's micro-batch tokens (never sized from memory), the train stage's FLOP
    rate in the record, no MFU (no peak to divide by)."""
    job = make_job(tiny_dir, training={"steps": 1, "promptsPerStep": 2})
    job.spec.training.model_fields_set.discard("micro_batch_tokens")
    run = build(job, checkpoint_dir=str(tmp_path / "ck"))
    try:
        assert run.trainer.budget.auto is False and run.trainer.peak_flops is None
        run.rollouts.source.start()
        record = run.loop.train_step()
    finally:
        run.rollouts.close()
    assert record.micro_batches >= 1 and record.train_flops_per_second > 0 and record.mfu is None
    assert record.to_json()["train_flops_per_second"] == record.train_flops_per_second


def test_model_flops_of_a_model_without_attention_fields_count_the_weights_only():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    del model.config.num_attention_heads  # a plug-in model's config may lack the field
    f = flops.model_flops(model)
    assert f.attention_width == 0 and f.sequence(3, 2) == 6 * f.matmul_params * 2
