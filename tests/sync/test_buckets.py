"""Bucket layout, packing and the wire format (pure, no processes)."""
import pytest
import torch

from grpojob.sync import buckets as bk


def _named():
    g = torch.Generator().manual_seed(0)
    return [("a", torch.randn(10, 4, generator=g)), ("b", torch.randn(3, generator=g).to(torch.bfloat16)),
            ("c", torch.randn(7, 7, generator=g)), ("d", torch.arange(5, dtype=torch.int64)),
            ("e", torch.randn(2, 2, generator=g).to(torch.bfloat16)), ("f", torch.randn(1, generator=g))]


def test_plan_groups_by_dtype_keeps_order_and_respects_the_size():
    named = _named()
    layout = bk.plan([(n, t.shape, t.dtype) for n, t in named], bucket_bytes=200)  # 50 float32s
    assert [(b.dtype, [e.name for e in b.entries]) for b in layout.buckets] == [
        ("float32", ["a"]),  # 40 floats; c (49) would overflow
        ("float32", ["c", "f"]),  # 49 + 1 floats: exactly full
        ("bfloat16", ["b", "e"]),
        ("int64", ["d"]),
    ]
    for b in layout.buckets:
        assert b.nbytes <= 200 or len(b.entries) == 1
        offsets = [e.offset for e in b.entries]
        assert offsets == sorted(offsets) and b.numel == sum(e.numel for e in b.entries)
    assert layout.nbytes == sum(t.numel() * t.element_size() for _, t in named)


def test_a_tensor_larger_than_a_bucket_gets_its_own():
    layout = bk.plan([("small", (4,), torch.float32), ("big", (1000,), torch.float32),
                      ("small2", (4,), torch.float32)], bucket_bytes=64)
    assert [[e.name for e in b.entries] for b in layout.buckets] == [["small"], ["big"], ["small2"]]


def test_pack_wire_unpack_round_trip_every_dtype():
    named = _named()
    layout = bk.plan([(n, t.shape, t.dtype) for n, t in named], bucket_bytes=128)
    layout = bk.Layout.from_json(layout.to_json())  # as the receiver sees it
    received = []
    for b in layout.buckets:
        sent = bk.pack(b, dict(named), bk.allocate(b))
        wire = bk.wire(sent).clone()  # the bytes that travel
        flat = bk.allocate(b)
        bk.wire(flat).copy_(wire)
        received += bk.unpack(b, flat)
    assert [n for n, _ in received] == [n for b in layout.buckets for n in (e.name for e in b.entries)]
    got = dict(received)
    for n, t in named:
        assert got[n].dtype == t.dtype and torch.equal(got[n], t)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="'x' appears twice"):
        bk.plan([("x", (1,), torch.float32), ("x", (1,), torch.float32)], 64)
    with pytest.raises(ValueError, match="complex64"):
        bk.plan([("z", (1,), torch.complex64)], 64)


def test_tied_aliases_are_sent_once():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    sd = Qwen2ForCausalLM(cfg).state_dict()
    names = [n for n, _ in bk.dedup_tied(sd.items())]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert len(names) == len(sd) - 1
    untied = Qwen2ForCausalLM(Qwen2Config(**{**cfg.to_dict(), "tie_word_embeddings": False})).state_dict()
    assert len(bk.dedup_tied(untied.items())) == len(untied)
