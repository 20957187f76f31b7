"""The trainer's CUDA path (skipped without a GPU): compiled flex attention with bf16 autocast over
float32 master weights trains like the float32 SDPA reference, bucketed shapes reuse compiled
kernels, and the real Qwen vocabulary fits the log-prob tiles."""
import copy

import pytest
import torch

from grpojob.learner.logprobs import PolicyLogprobs, linear_logprobs
from grpojob.learner.packing import pack
from grpojob.learner.sizing import for_device

from .test_packing import _reference, _seqs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model(tiny_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="sdpa", dtype=torch.float32)


def test_cuda_shape_is_flex_bf16_compiled_one_bucketed_row(model):
    shape = for_device(torch.device("cuda"), model)
    assert (shape.attention, shape.compute_dtype, shape.compile, shape.bucket) == \
        ("flex", torch.bfloat16, "dynamic", True)
    mbs = shape.pack(_seqs(8, 4), 256, pad_id=0)
    assert all(mb.shape[0] == 1 and mb.shape[1] % 128 == 0 for mb in mbs)


def test_compiled_flex_bf16_matches_the_fp32_sdpa_reference(model):
    dev = torch.device("cuda")
    seqs = _seqs(6, 4)
    ref_lp = _reference(model, seqs)
    shape = for_device(dev, model)
    fast = copy.deepcopy(model).to(dev)
    policy = PolicyLogprobs(fast, shape)
    slow = copy.deepcopy(model).to(dev)
    ref_policy = PolicyLogprobs(slow)
    for mb in shape.pack(seqs, 256, pad_id=0):
        logp, _ = policy(**mb.inputs(dev, shape.attention))
        (logp * mb.advantages.to(dev)).sum().backward()
        for local, i in enumerate(mb.seqs):  # bf16 compute: loose, but a wrong mask is off by far more
            torch.testing.assert_close(logp[mb.seq_index.to(dev) == local].cpu(), ref_lp[i], atol=0.08, rtol=0.05)
    for mb in pack(seqs, 256, row_tokens=256):
        logp, _ = ref_policy(**mb.inputs(dev, "sdpa"))
        (logp * mb.advantages.to(dev)).sum().backward()
    for (name, a), b in zip(fast.named_parameters(), slow.parameters()):
        assert a.dtype == torch.float32  # master weights stay float32 under autocast
        cos = torch.nn.functional.cosine_similarity(a.grad.flatten(), b.grad.flatten(), dim=0)
        assert cos > 0.99, f"{name}: gradient cosine {cos:.4f}"


def test_bucketed_shapes_reuse_compiled_kernels(model):
    import torch._dynamo

    dev = torch.device("cuda")
    shape = for_device(dev, model)
    policy = PolicyLogprobs(copy.deepcopy(model).to(dev), shape)
    torch._dynamo.utils.counters.clear()
    shapes = set()
    for seed in range(6):  # new groups, new lengths every step
        for mb in shape.pack(_seqs(5, 4, seed=seed), 512, pad_id=0):
            shapes.add(mb.shape)
            logp, _ = policy(**mb.inputs(dev, shape.attention))
            logp.sum().backward()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert len(shapes) <= 3 and frames <= 4 * len(shapes) * 2, (shapes, frames)


def test_qwen_vocabulary_logprobs_stay_within_tiles():
    dev = torch.device("cuda")
    vocab, hidden, n = 151_936, 896, 8192
    weight = (torch.randn(vocab, hidden, device=dev) * 0.02).requires_grad_()
    h = torch.randn(n, hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), device=dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    logp, ent = linear_logprobs(h, weight, None, targets, entropy=True)
    logp.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    full = n * vocab * 4  # what one float32 [tokens, vocab] logits tensor would take (5 GB)
    assert peak < full / 4, f"peak {peak / 2**30:.2f} GiB"
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all()


def test_micro_batch_cap_from_this_gpus_free_memory(model):
    from grpojob.learner import sizing

    dev = torch.device("cuda")
    m = copy.deepcopy(model).to(dev)
    cap = sizing.cuda_cap(m, dev, 256, sum(p.numel() for p in m.parameters()), 4 * sizing.TILE_ELEMENTS)
    assert 256 <= cap <= sizing.MAX_AUTO_TOKENS and cap & (cap - 1) == 0, cap


def test_liger_layers_match_the_models_own_and_touch_no_other_model(model):
    pytest.importorskip("liger_kernel")
    from transformers import AutoModelForCausalLM

    from grpojob.learner import kernels

    dev = torch.device("cuda")
    plain, fused = copy.deepcopy(model).to(dev), copy.deepcopy(model).to(dev)
    module = __import__(type(model).__module__, fromlist=["_"])
    names = dict(vars(module))
    assert kernels.apply(fused, dev)
    assert {k: v for k, v in vars(module).items() if k in names} == names  # the module is transformers' again
    later = AutoModelForCausalLM.from_pretrained(model.name_or_path, dtype=torch.float32)
    assert type(later.model.norm).__module__ == type(model.model.norm).__module__
    seqs = _seqs(6, 4)
    out = []
    for m, on in ((plain, False), (fused, True)):
        shape = for_device(dev, m, on)
        assert (shape.compile is None) == on
        policy = PolicyLogprobs(m, shape)
        out.append([policy(**mb.inputs(dev, shape.attention))[0].float().cpu() for mb in shape.pack(seqs, 256, 0)])
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=0.08, rtol=0.05)
