"""The CUDA rule that flex attention and its BlockMask compile once for every micro-batch width
(learner.attention._compiled), checked on the CPU through the same functions: forward only, as
torch has no flex backward on the CPU. Compiled for static shapes, each width a step's packing
chose anew recompiled both on an H200 (the step took 12.7 s instead of 0.9)."""
from __future__ import annotations

import torch
import torch._dynamo

from grpojob.learner import attention
from grpojob.learner.spans import LENGTH, PREFIX_LEN, PREFIX_START, ROW, START


def _spans(width: int) -> torch.Tensor:
    """One row: a prompt of width/4 tokens, then three completions of it tiling the rest."""
    prompt, rest = width // 4, width - width // 4
    sizes = [rest // 3, rest // 3, rest - 2 * (rest // 3)]
    rows, at = [[0, 0, 0, 0, prompt]], prompt  # row, prefix start, prefix length, start, length
    for n in sizes:
        rows.append([0, 0, prompt, at, n])
        at += n
    out = torch.zeros(len(rows), 5, dtype=torch.long)
    out[:, [ROW, PREFIX_START, PREFIX_LEN, START, LENGTH]] = torch.tensor(rows)
    return out


def test_flex_attention_and_its_mask_compile_once_for_every_width():
    g = torch.Generator().manual_seed(0)
    kernel = attention.flex_kernel("cuda")  # the compiled kernel the GPU's uncompiled layers call
    for i, width in enumerate((256, 512, 1024, 512)):  # (a one-tile width of 128 is a case of its own)
        q, k, v = (torch.randn(1, 2, width, 16, generator=g) for _ in range(3))
        spans = _spans(width)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            mask = attention.flex_mask(spans, 1, width, compiled=True)
            out = kernel(q, k, v, block_mask=mask)
        dense = attention.dense_mask(spans, 1, width)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)


def test_under_bf16_autocast_flex_attention_gets_bf16_q_k_and_v(tiny_dir, monkeypatch):
    """CUDA rule (learner.attention._compute_dtype), on the CPU's same code path: the trainer's
    float32 master weights under bf16 autocast give q and k in float32 (RoPE's float32 cos/sin)
    beside a bf16 v; flex attention must get all three in bf16, as SDPA casts them under autocast,
    or it runs in float32 (on an H200 a third of the train stage's device time)."""
    from transformers import AutoModelForCausalLM

    seen = []

    def spy(device_type):
        from torch.nn.attention.flex_attention import flex_attention

        def kernel(q, k, v, **kw):
            seen.append((q.dtype, k.dtype, v.dtype))
            return flex_attention(q, k, v, **kw)
        return kernel

    monkeypatch.setattr(attention, "flex_kernel", spy)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    attention.install(model, "flex")
    ids = torch.randint(3, 100, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = model(input_ids=ids).logits
    layers = model.config.num_hidden_layers
    assert seen == [(torch.float32,) * 3] * layers + [(torch.bfloat16,) * 3] * layers
    torch.testing.assert_close(fast.float(), plain, atol=0.1, rtol=0.05)  # bf16 compute: loose
